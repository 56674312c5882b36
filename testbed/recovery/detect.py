"""Failures, as every strategy sees them: when and how each was detected, journalled, counted.

The failure of a step is seen at the earliest of the configured detectors:
the node heartbeat (``t_death + heartbeat_s * missed``), the survivors'
collective timeout (``earliest blocked wait + exec_s``) and the learned step
watchdog; a failure without a death is found by the timeout that fired.
:func:`record_failure` journals it (who died, as Ray reported it; every other
rank's error) and counts it against ``policy.recovery.max_restarts``, and
raises what no restart cures. :func:`replace_lost` gives the lost ranks new
processes (or hot spares); :func:`completed_in_place` records a recovery
that ran the step again where it stood.
"""

from __future__ import annotations

from typing import Any

from testbed.actors.outcome import Outcome, describe_ray_error, is_death
from testbed.core.errors import (
    CollectiveTimeout,
    DeviceFault,
    DeviceOOM,
    LinkSetupTimeout,
    PeerLost,
    RankHung,
    RecoveryFailed,
    TestbedError,
    UnsupportedOperator,
)
from testbed.recovery.context import Phase, RecoveryContext
from testbed.recovery.record import Recovery


def _detect(
    ctx: RecoveryContext, out: dict[int, Outcome], deaths: list[dict[str, Any]]
) -> tuple[float, float, str]:
    """(t_death, t_detect, detector) from the survivors' errors and the supervisors' records."""
    t_death = min(d["t"] for d in deaths)
    options: dict[str, float] = {}
    waits = [o.error.wait_start for o in out.values() if isinstance(o.error, PeerLost)]
    if waits:
        options["exec_timeout"] = min(waits) + ctx.scenario.policy.timeouts.exec_s
    fired = [float(o.error.fields["t"]) for o in out.values() if isinstance(o.error, CollectiveTimeout)]
    if fired:  # a hung peer: the survivors' exec timeouts fired in virtual time
        options["exec_timeout"] = min([*fired, options.get("exec_timeout", float("inf"))])
    hb = ctx.scenario.policy.detection
    if hb is not None:
        options["heartbeat"] = t_death + hb.timeout_s
    watchdog = learned_watchdog(ctx)
    if watchdog is not None:
        options["learned_step_timeout"] = max(watchdog, t_death)
    if not options:
        raise RecoveryFailed(
            "a rank died but no detector is configured and no survivor was waiting on it; "
            "set policy.detection",
        )
    by = min(options, key=lambda k: options[k])
    return t_death, options[by], by


#: Failures of the modelled job that a restart may cure (a version mismatch never does).
RESTARTABLE = (PeerLost, CollectiveTimeout, LinkSetupTimeout, DeviceOOM, DeviceFault)


def learned_watchdog(ctx: RecoveryContext) -> float | None:
    """When the learned step timeout fires on the step in flight (None: nothing learned yet)."""
    limit = ctx.learner.timeout("step") if ctx.learner is not None else None
    if limit is None or ctx.step_t0 is None:
        return None
    return ctx.step_t0 + limit


def timeout_detect(out: dict[int, Outcome], watchdog: float | None = None) -> tuple[float, float, str]:
    """(t_fail, t_detect, detector) for a failure without deaths: the earliest timeout fires (the
    learned step watchdog among them, when it is set and fires first)."""
    errs = [o.error for o in out.values() if isinstance(o.error, TestbedError)]
    t_detect = min(float(e.fields.get("t", 0.0)) for e in errs)
    t_fail = min(float(e.fields.get("wait_start", e.fields.get("t", 0.0))) for e in errs)
    by = "exec_timeout"
    if any(isinstance(e, LinkSetupTimeout) for e in errs):
        by = "connect_timeout"
    if any(isinstance(e, DeviceOOM) for e in errs):
        by = "device_oom"
    if any(isinstance(e, UnsupportedOperator) for e in errs):
        by = "operator_error"
    if any(isinstance(e, DeviceFault) for e in errs):
        by = "device_fault"
    if by == "exec_timeout" and watchdog is not None and max(watchdog, t_fail) < t_detect:
        return t_fail, max(watchdog, t_fail), "learned_step_timeout"
    return t_fail, t_detect, by


def _classify(out: dict[int, Outcome]) -> dict[str, Any]:
    """Each failed rank's error, as the journal shows it."""
    found: dict[str, Any] = {}
    for r, o in out.items():
        e = o.error
        if isinstance(e, TestbedError) and not is_death(e):
            found[str(r)] = {
                "error": type(e).__name__,
                "how": e.fields.get("how"),
                "true_timeout": e.fields.get("true_timeout"),
                "peer": e.fields.get("peer"),
                "wait_start": e.fields.get("wait_start"),
                "op": e.fields.get("op"),
            }
            if e.fields.get("how") == "direct":
                found[str(r)]["message"] = e.message
            if e.fields.get("sdc"):  # the silent corruption behind a device fault: the truth
                found[str(r)]["sdc"] = e.fields["sdc"]
    return found


def journal_failure(
    ctx: RecoveryContext,
    phase: Phase,
    step: int,
    out: dict[int, Outcome],
    deaths: list[dict[str, Any]],
    detection: tuple[float, float, str],
) -> None:
    """One ``failure_detected`` event: who died (as Ray reported it), every other rank's error."""
    t_fail, t_detect, by = detection
    dead = [d["rank"] for d in deaths]
    ctx.journal.emit(
        "failure_detected",
        phase=phase.name,
        step=step,
        dead=dead,
        t_death=t_fail,
        t=t_detect,
        detected_by=by,
        **({"t_start": ctx.step_t0} if ctx.step_t0 is not None else {}),
        killed=[{k: d[k] for k in ("rank", "pid", "point", "gone", "step") if k in d} for d in deaths],
        ray_error={str(r): describe_ray_error(out[r].error) for r in dead},  # type: ignore[arg-type]
        errors=_classify(out),
    )


def record_failure(
    ctx: RecoveryContext, phase: Phase, step: int, out: dict[int, Outcome]
) -> tuple[list[int], tuple[float, float, str]]:
    """Journal the failure of ``step`` and count it against ``max_restarts``: the lost ranks
    (dead, or hung and now killed) and (t_failure, t_detect, detector). Raises what no restart cures."""
    for r, o in sorted(out.items()):
        if isinstance(o.error, RankHung):  # frozen, alive: the recovery kills it before replacing it
            f = o.error.fields
            ctx.cluster.kill(r, float(f["t"]), int(f["step"]), "hang")
    unreachable = ctx.detach_cut_off(step, out)  # cut off from the controller: lost, though running
    dead = sorted(
        r for r, o in out.items() if is_death(o.error) or isinstance(o.error, RankHung) or r in unreachable
    )
    errors = [o.error for r, o in out.items() if o.error is not None and r not in dead]
    beyond = [e for e in errors if not isinstance(e, RESTARTABLE)]
    bugs = [e for e in beyond if not isinstance(e, TestbedError)]
    if bugs:
        raise bugs[0]  # not a modelled failure at all: the run reports a crash
    if dead:
        deaths = [d for d in ctx.cluster.deaths(expected=dead) if d["rank"] in dead]
        unexplained = sorted(set(dead) - {d["rank"] for d in deaths})
        if unexplained:
            said = "; ".join(describe_ray_error(e) for r in unexplained if (e := out[r].error) is not None)
            raise TestbedError(
                f"the process of rank(s) {unexplained} died at step {step}, and no fault of the plan killed "
                f"it (seen as {said}): the host killed it (the OOM killer?) or it crashed; Ray's own "
                "account of a lost supernode is in the run directory's ray.log",
                ranks=unexplained,
                step=step,
            )
        detection = _detect(ctx, out, deaths)
    else:
        deaths = []
        detection = timeout_detect(out, learned_watchdog(ctx))
    journal_failure(ctx, phase, step, out, deaths, detection)
    if beyond:  # not a failure a restart cures (or a testbed error): report the rank's own, not a copy
        cause = min(
            beyond, key=lambda e: not (isinstance(e, TestbedError) and e.fields.get("how") == "direct")
        )
        if isinstance(cause, TestbedError):
            cause.fields["beyond_recovery"] = True
        raise cause
    phase.restarts += 1
    policy = ctx.scenario.policy.recovery
    if phase.restarts > policy.max_restarts:
        raise RecoveryFailed(
            f"restart {phase.restarts} at step {step} exceeds policy.recovery.max_restarts "
            f"= {policy.max_restarts}; raise it or make the run less faulty",
            step=step,
        )
    return dead, detection


def replace_lost(ctx: RecoveryContext, phase: Phase, dead: list[int], hot: bool) -> bool:
    """New processes (or, with ``hot``, spares) for the ``dead`` ranks; True when spares took them all."""
    all_spares = bool(dead) and hot
    for rank in dead:
        old = ctx.cluster.pids[rank]
        new, spare = ctx.cluster.replace_with_spare(rank) if hot else (ctx.cluster.replace(rank), False)
        all_spares = all_spares and spare
        ctx.journal.emit(
            "npu_replaced",
            phase=phase.name,
            rank=rank,
            old_pid=old,
            new_pid=new,
            spare=spare,
            node=ctx.cluster.nodes.get(rank),
        )
    return all_spares


def completed_in_place(
    ctx: RecoveryContext,
    phase: Phase,
    step: int,
    detection: tuple[float, float, str],
    t_resume: float,
    t_done: float,
    breakdown: dict[str, float],
    strategy: str,
    wall_start: float,
) -> Recovery:
    """Record and journal a recovery that ran ``step`` (or its collective) again in place, without
    going back to saved state: op retry, step retry, an elastic shrink."""
    t_fail, t_detect, by = detection
    rec = Recovery(
        phase=phase.name,
        fail_step=step,
        t_death=t_fail,
        t_detect=t_detect,
        detected_by=by,
        resume_step=step,
        t_resume=t_resume,
        breakdown={"detect_s": t_detect - t_fail, **breakdown},
        wall_start=wall_start,
        strategy=strategy,
    )
    ctx.add_recovery(rec)
    rec.complete(ctx.journal, phase.name, t_done)
    return rec
