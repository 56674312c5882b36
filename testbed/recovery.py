"""Recovery strategies ``restart`` and ``op_retry``, with every part of their cost in virtual seconds.

``op_retry`` (HCCL_OP_RETRY_ENABLE): when a collective fails by timeout on
every rank and no process died, run it again ``hold_s + interval_s`` after the
timeout fired, up to ``retries`` times (A3 defaults: 1 retry, 5 s, 1 s); the
step's compute is kept. If that fails too, the job restarts.

A restart, as a job-level restart does on a real cluster:

1. detect: the failure is seen at the earliest of the configured detectors:
   the node heartbeat (``t_death + heartbeat_s * missed``) and the survivors'
   collective timeout (``earliest blocked wait + exec_s``);
2. restart: the lost NPU processes are really re-created; every rank starts
   afresh (initial state), charged ``policy.recovery.restart_s``;
3. re-link: a new group epoch sets every link up again (seeded setup model);
4. load: the newest committed checkpoint that verifies is read by every rank,
   charged ``bytes / storage bandwidth`` (the storage is shared);
5. recompute: the steps between the checkpoint and the failure are run again;
   their virtual time is measured when the run passes the failed step's predecessor.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from testbed import checkpoint as ckpt
from testbed.cluster import Outcome, describe_ray_error, is_death
from testbed.errors import (
    CollectiveTimeout,
    LinkSetupTimeout,
    PeerLost,
    RankHung,
    RecoveryFailed,
    TestbedError,
    UnsupportedOperator,
)
from testbed.journal import Journal
from testbed.memory import DeviceOOM

if TYPE_CHECKING:
    from testbed.controller import Controller, PhaseState


@dataclass
class Recovery:
    """One recovery: where it started, the breakdown so far, and where training resumed."""

    phase: str
    fail_step: int
    t_death: float
    t_detect: float
    detected_by: str
    resume_step: int
    t_resume: float
    breakdown: dict[str, float] = field(default_factory=dict)
    wall_start: float = 0.0
    strategy: str = "restart"

    @property
    def resumed(self) -> bool:
        """True when training resumed from a checkpoint (restart, hot spare), so steps were recomputed."""
        return self.strategy in ("restart", "hot_spare")

    def complete(self, journal: Journal, phase: str, t_done: float) -> None:
        """Close the recovery once the lost steps are recomputed; journal the breakdown."""
        if self.resumed:
            self.breakdown["recompute_s"] = t_done - self.t_resume
        total = sum(self.breakdown.values())
        journal.emit(
            "recovery_complete",
            phase=phase,
            fail_step=self.fail_step,
            resume_step=self.resume_step,
            strategy=self.strategy,
            detected_by=self.detected_by,
            breakdown=dict(self.breakdown),
            total_s=total,
            t=t_done,
            wall_recovery_s=round(time.monotonic() - self.wall_start, 3),
        )


def _detect(
    ctrl: Controller, out: dict[int, Outcome], deaths: list[dict[str, Any]]
) -> tuple[float, float, str]:
    """(t_death, t_detect, detector) from the survivors' errors and the supervisors' records."""
    t_death = min(d["t"] for d in deaths)
    options: dict[str, float] = {}
    waits = [o.error.wait_start for o in out.values() if isinstance(o.error, PeerLost)]
    if waits:
        options["exec_timeout"] = min(waits) + ctrl.scenario.policy.timeouts.exec_s
    fired = [float(o.error.fields["t"]) for o in out.values() if isinstance(o.error, CollectiveTimeout)]
    if fired:  # a hung peer: the survivors' exec timeouts fired in virtual time
        options["exec_timeout"] = min([*fired, options.get("exec_timeout", float("inf"))])
    hb = ctrl.scenario.policy.detection
    if hb is not None:
        options["heartbeat"] = t_death + hb.heartbeat_s * hb.missed
    if not options:
        raise RecoveryFailed(
            "a rank died but no detector is configured and no survivor was waiting on it; "
            "set policy.detection",
        )
    by = min(options, key=lambda k: options[k])
    return t_death, options[by], by


#: Failures of the modelled job that a restart may cure (a version mismatch never does).
RESTARTABLE = (PeerLost, CollectiveTimeout, LinkSetupTimeout, DeviceOOM)


def _timeout_detect(out: dict[int, Outcome]) -> tuple[float, float, str]:
    """(t_fail, t_detect, detector) for a failure without deaths: the earliest timeout fires."""
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
    return t_fail, t_detect, by


def _classify(out: dict[int, Outcome]) -> dict[str, Any]:
    """Each failed rank's error, as the journal shows it."""
    found: dict[str, Any] = {}
    for r, o in out.items():
        e = o.error
        if isinstance(e, TestbedError):
            found[str(r)] = {
                "error": type(e).__name__,
                "how": e.fields.get("how"),
                "true_timeout": e.fields.get("true_timeout"),
                "peer": e.fields.get("peer"),
                "wait_start": e.fields.get("wait_start"),
            }
            if e.fields.get("how") == "direct":
                found[str(r)]["message"] = e.message
    return found


def _journal_failure(
    ctrl: Controller,
    phase: PhaseState,
    step: int,
    out: dict[int, Outcome],
    deaths: list[dict[str, Any]],
    detection: tuple[float, float, str],
) -> None:
    """One ``failure_detected`` event: who died (as Ray reported it), every other rank's error."""
    t_fail, t_detect, by = detection
    dead = [d["rank"] for d in deaths]
    ctrl.journal.emit(
        "failure_detected",
        phase=phase.name,
        step=step,
        dead=dead,
        t_death=t_fail,
        t=t_detect,
        detected_by=by,
        killed=[{k: d[k] for k in ("rank", "pid", "point", "gone")} for d in deaths],
        ray_error={str(r): describe_ray_error(out[r].error) for r in dead},  # type: ignore[arg-type]
        errors=_classify(out),
    )


def restart(ctrl: Controller, phase: PhaseState, step: int, out: dict[int, Outcome]) -> Recovery:
    """Recover from the failed ``step`` by restarting from the newest committed checkpoint."""
    wall_start = time.monotonic()
    for r, o in sorted(out.items()):
        if isinstance(o.error, RankHung):  # frozen, alive: the recovery kills it before replacing it
            f = o.error.fields
            ctrl.cluster.kill(r, float(f["t"]), int(f["step"]), "hang")
            ctrl.cluster.frozen.pop(r, None)
            ctrl.cluster.may_hang.discard(r)
    dead = sorted(r for r, o in out.items() if is_death(o.error) or isinstance(o.error, RankHung))
    errors = [o.error for r, o in out.items() if o.error is not None and r not in dead]
    beyond = [e for e in errors if not isinstance(e, RESTARTABLE)]
    bugs = [e for e in beyond if not isinstance(e, TestbedError)]
    if bugs:
        raise bugs[0]  # not a modelled failure at all: the run reports a crash
    if dead:
        deaths = [d for d in ctrl.cluster.deaths(expected=dead) if d["rank"] in dead]
        if {d["rank"] for d in deaths} != set(dead):
            raise TestbedError(f"ranks {dead} died at step {step} but their supervisor killed none of them")
        t_death, t_detect, by = _detect(ctrl, out, deaths)
    else:
        deaths = []
        t_death, t_detect, by = _timeout_detect(out)
    _journal_failure(ctrl, phase, step, out, deaths, (t_death, t_detect, by))
    if beyond:  # not a failure a restart cures (or a testbed error): report the rank's own, not a copy
        raise min(beyond, key=lambda e: not (isinstance(e, TestbedError) and e.fields.get("how") == "direct"))
    phase.restarts += 1
    policy = ctrl.scenario.policy.recovery
    if phase.restarts > policy.max_restarts:
        raise RecoveryFailed(
            f"restart {phase.restarts} at step {step} exceeds policy.recovery.max_restarts "
            f"= {policy.max_restarts}; raise it or make the run less faulty",
            step=step,
        )
    hot = policy.strategy == "hot_spare"
    all_spares = bool(dead) and hot
    for rank in dead:
        old = ctrl.cluster.pids[rank]
        new, spare = ctrl.cluster.replace_with_spare(rank) if hot else (ctrl.cluster.replace(rank), False)
        all_spares = all_spares and spare
        ctrl.journal.emit("npu_replaced", phase=phase.name, rank=rank, old_pid=old, new_pid=new, spare=spare)
    # with every lost rank taken by a running spare, no process restarts: the spare is activated
    activation, cost = ("spare_s", policy.spare_s) if all_spares else ("restart_s", policy.restart_s)
    t_restarted = t_detect + cost
    ctrl.cluster.call_ok("reset", t_restarted)
    t_linked = ctrl.open_group(t_restarted)
    assert phase.ckpt_root is not None
    found, skipped = ckpt.newest(phase.ckpt_root, persisted_by=t_death)
    for reason in skipped:
        ctrl.journal.emit("checkpoint_skipped", phase=phase.name, reason=reason)
    load_s, resume_step, components = 0.0, 1, {}
    if found is not None:
        restore = ctrl.scenario.policy.checkpoint.restore
        loaded = ctrl.cluster.call_ok("restore", per_rank=lambda r: (found.files_of(r, restore),))
        load_s = sum(loaded.values()) / ctrl.storage_Bps
        resume_step = found.step + 1
        components = {str(r): sorted(found.files_of(r, restore)) for r in sorted(loaded)}
    t_resume = t_linked + load_s
    ctrl.journal.emit(
        "resume",
        phase=phase.name,
        from_step=resume_step - 1,
        t=t_resume,
        components=components,
        checkpoint=found is not None,
    )
    return Recovery(
        phase=phase.name,
        fail_step=step,
        t_death=t_death,
        t_detect=t_detect,
        detected_by=by,
        resume_step=resume_step,
        t_resume=t_resume,
        breakdown={
            "detect_s": t_detect - t_death,
            activation: cost,
            "relink_s": t_linked - t_restarted,
            "load_s": load_s,
        },
        wall_start=wall_start,
        strategy="hot_spare" if all_spares else "restart",
    )


def op_retry_applies(ctrl: Controller, out: dict[int, Outcome]) -> bool:
    """Op retry handles a gradient sync that failed on every rank by timeout, with no rank dead.

    A collective inside the forward or backward pass (TP, PP, EP) is not
    retried: the step's state has moved on; step retry or a restart handles it.
    """
    if ctrl.scenario.policy.recovery.strategy not in ("op_retry", "ladder"):
        return False
    return all(
        isinstance(o.error, CollectiveTimeout) and o.error.fields.get("phase") == "grad_sync"
        for o in out.values()
    )


#: Failures a step retry may cure: a collective that timed out or a link that took too long to set up.
TRANSIENT = (CollectiveTimeout, LinkSetupTimeout)


def step_retry_applies(ctrl: Controller, out: dict[int, Outcome]) -> bool:
    """Step retry handles a step that failed on some rank by a transient error, with no process lost."""
    if ctrl.scenario.policy.recovery.strategy not in ("step_retry", "ladder"):
        return False
    errors = [o.error for o in out.values() if o.error is not None]
    return bool(errors) and all(isinstance(e, TRANSIENT) for e in errors)


def _retry(
    ctrl: Controller, phase: PhaseState, step: int, out: dict[int, Outcome], strategy: str, **event: Any
) -> dict[int, Outcome]:
    """One retry in place, after HCCL's hold and interval: ``op_retry`` re-runs the step's gradient
    sync (``retry_step``), ``step_retry`` the whole step from its snapshot (``rerun_step``).

    Returns the attempt's outcomes; a success is journalled as a completed
    recovery (detect, hold, interval, and for a step retry the step's second run).
    """
    policy = ctrl.scenario.policy.recovery.op_retry
    wall_start = time.monotonic()
    t_fail, t_detect, by = _timeout_detect(out)
    _journal_failure(ctrl, phase, step, out, [], (t_fail, t_detect, by))
    t_retry = t_detect + policy.hold_s + policy.interval_s
    ctrl.journal.emit(strategy, phase=phase.name, step=step, **event, t=t_retry)
    method = "rerun_step" if strategy == "step_retry" else "retry_step"
    out = ctrl.cluster.call(method, step, t_retry)
    if not all(o.ok for o in out.values()):
        return out
    breakdown = {"detect_s": t_detect - t_fail, "hold_s": policy.hold_s, "interval_s": policy.interval_s}
    t_done = t_retry
    if strategy == "step_retry":
        t_done = max(float(o.value["t"]) for o in out.values())
        breakdown["recompute_s"] = t_done - t_retry
    rec = Recovery(
        phase=phase.name,
        fail_step=step,
        t_death=t_fail,
        t_detect=t_detect,
        detected_by=by,
        resume_step=step,
        t_resume=t_retry,
        strategy=strategy,
        wall_start=wall_start,
        breakdown=breakdown,
    )
    ctrl.recoveries.append(rec)
    rec.complete(ctrl.journal, phase.name, t_done)
    return out


def step_retry(ctrl: Controller, phase: PhaseState, step: int, out: dict[int, Outcome]) -> dict[int, Outcome]:
    """Run the failed step again from the state it started from, after the same hold and interval as op retry.

    Every rank restores its in-memory snapshot of the step's start (parameters,
    optimizer, scheduler, RNG, data cursor) and trains the step again; nothing
    is loaded from storage and no process restarts.
    """
    return _retry(ctrl, phase, step, out, "step_retry")


def op_retry(ctrl: Controller, phase: PhaseState, step: int, out: dict[int, Outcome]) -> dict[int, Outcome]:
    """Re-run the step's collective after HCCL's hold and interval, up to ``retries`` times.

    Returns the last attempt's outcomes.
    """
    for attempt in range(1, ctrl.scenario.policy.recovery.op_retry.retries + 1):
        out = _retry(ctrl, phase, step, out, "op_retry", attempt=attempt)
        if all(o.ok for o in out.values()) or not op_retry_applies(ctrl, out):
            break
    return out
