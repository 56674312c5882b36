"""Recovery by restart: ``restart``, ``hot_spare`` and ``replica``, with every part of their cost in
virtual seconds, and the detection and journalling of failures that every strategy shares
(``op_retry`` and ``step_retry`` are in :mod:`testbed.recovery.retry`, ``elastic`` in
:mod:`testbed.recovery.elastic`).

``replica`` restores from in-memory copies (:mod:`testbed.train.replica_store`) instead of
storage: the lost ranks are restarted and fetch their copy from the peer
that holds it, the others load their own; it falls back to a restart from
storage when no copy is usable. ``hot_spare`` is a restart in which running
spares take the lost ranks (``spare_s`` instead of ``restart_s``).

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

from testbed.actors.cluster import Outcome, describe_ray_error, is_death
from testbed.core.errors import (
    CollectiveTimeout,
    LinkSetupTimeout,
    PeerLost,
    RankHung,
    RecoveryFailed,
    TestbedError,
    UnsupportedOperator,
)
from testbed.core.journal import Journal
from testbed.train import checkpoint as ckpt
from testbed.train.device_memory import DeviceOOM
from testbed.train.replica_store import ReplicaGeneration, State, holder_of, usable

if TYPE_CHECKING:
    from testbed.run.controller import Controller, PhaseState


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
        """True when training resumed from a persistent checkpoint (restart, hot spare)."""
        return self.strategy in ("restart", "hot_spare")

    @property
    def recomputes(self) -> bool:
        """True when training went back to a saved state (a checkpoint or a replica) and recomputes."""
        return self.resumed or self.strategy == "replica"

    def complete(self, journal: Journal, phase: str, t_done: float) -> None:
        """Close the recovery once the lost steps are recomputed; journal the breakdown."""
        if self.recomputes:
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
    watchdog = learned_watchdog(ctrl)
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
RESTARTABLE = (PeerLost, CollectiveTimeout, LinkSetupTimeout, DeviceOOM)


def learned_watchdog(ctrl: Controller) -> float | None:
    """When the learned step timeout fires on the step in flight (None: nothing learned yet)."""
    limit = ctrl.learner.timeout("step") if ctrl.learner is not None else None
    if limit is None or ctrl.step_t0 is None:
        return None
    return ctrl.step_t0 + limit


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
    if by == "exec_timeout" and watchdog is not None and max(watchdog, t_fail) < t_detect:
        return t_fail, max(watchdog, t_fail), "learned_step_timeout"
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
                "op": e.fields.get("op"),
            }
            if e.fields.get("how") == "direct":
                found[str(r)]["message"] = e.message
    return found


def journal_failure(
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
        killed=[{k: d[k] for k in ("rank", "pid", "point", "gone", "step") if k in d} for d in deaths],
        ray_error={str(r): describe_ray_error(out[r].error) for r in dead},  # type: ignore[arg-type]
        errors=_classify(out),
    )


def record_failure(
    ctrl: Controller, phase: PhaseState, step: int, out: dict[int, Outcome]
) -> tuple[list[int], tuple[float, float, str]]:
    """Journal the failure of ``step`` and count it against ``max_restarts``: the lost ranks
    (dead, or hung and now killed) and (t_failure, t_detect, detector). Raises what no restart cures."""
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
        unexplained = sorted(set(dead) - {d["rank"] for d in deaths})
        if unexplained:
            said = "; ".join(describe_ray_error(e) for r in unexplained if (e := out[r].error) is not None)
            raise TestbedError(
                f"the process of rank(s) {unexplained} died at step {step}, and no fault of the plan killed "
                f"it (Ray: {said}): the host killed it (the OOM killer?) or it crashed; Ray's own account "
                "is in the run directory's ray.log",
                ranks=unexplained,
                step=step,
            )
        detection = _detect(ctrl, out, deaths)
    else:
        deaths = []
        detection = timeout_detect(out, learned_watchdog(ctrl))
    journal_failure(ctrl, phase, step, out, deaths, detection)
    if beyond:  # not a failure a restart cures (or a testbed error): report the rank's own, not a copy
        cause = min(
            beyond, key=lambda e: not (isinstance(e, TestbedError) and e.fields.get("how") == "direct")
        )
        if isinstance(cause, TestbedError):
            cause.fields["beyond_recovery"] = True
        raise cause
    phase.restarts += 1
    policy = ctrl.scenario.policy.recovery
    if phase.restarts > policy.max_restarts:
        raise RecoveryFailed(
            f"restart {phase.restarts} at step {step} exceeds policy.recovery.max_restarts "
            f"= {policy.max_restarts}; raise it or make the run less faulty",
            step=step,
        )
    return dead, detection


def replace_lost(ctrl: Controller, phase: PhaseState, dead: list[int], hot: bool) -> bool:
    """New processes (or, with ``hot``, spares) for the ``dead`` ranks; True when spares took them all."""
    all_spares = bool(dead) and hot
    for rank in dead:
        old = ctrl.cluster.pids[rank]
        new, spare = ctrl.cluster.replace_with_spare(rank) if hot else (ctrl.cluster.replace(rank), False)
        all_spares = all_spares and spare
        ctrl.journal.emit(
            "npu_replaced",
            phase=phase.name,
            rank=rank,
            old_pid=old,
            new_pid=new,
            spare=spare,
            node=ctrl.cluster.nodes.get(rank),
        )
    return all_spares


def restart(ctrl: Controller, phase: PhaseState, step: int, out: dict[int, Outcome]) -> Recovery:
    """Recover from the failed ``step`` by restarting from the newest committed checkpoint."""
    wall_start = time.monotonic()
    dead, detection = record_failure(ctrl, phase, step, out)
    return _from_storage(ctrl, phase, step, dead, detection, wall_start)


def _from_storage(
    ctrl: Controller,
    phase: PhaseState,
    step: int,
    dead: list[int],
    detection: tuple[float, float, str],
    wall_start: float,
) -> Recovery:
    """Replace the lost ranks, restart every rank, re-link, load the newest verified checkpoint."""
    t_death, t_detect, by = detection
    policy = ctrl.scenario.policy.recovery
    ctrl.shrunk = None  # a restart brings every rank back, whatever an elastic shrink left out
    all_spares = replace_lost(ctrl, phase, dead, policy.strategy == "hot_spare")
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
        load_s = sum(loaded.values()) * ctrl.state_scale / ctrl.storage_Bps
        resume_step = found.step + 1
        components = {str(r): sorted(found.files_of(r, restore)) for r in sorted(loaded)}
    t_resume = t_linked + load_s
    ctrl.forget_replicas_after(resume_step - 1)
    ctrl.resumed_from(found.manifest if found is not None else None)
    ctrl.journal.emit(
        "resume",
        phase=phase.name,
        from_step=resume_step - 1,
        t=t_resume,
        components=components,
        checkpoint=found is not None,
        source="checkpoint",
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


def _replica_sources(
    ctrl: Controller, dead: list[int], t_failure: float
) -> tuple[ReplicaGeneration, dict[int, State]] | str:
    """The newest replica generation every rank can be restored from, with the lost ranks' copies
    fetched from their holders; or why there is none."""
    topo = ctrl.cluster.topology
    gens = usable(ctrl.replica_gens, t_failure)
    if not gens:
        return f"no in-memory replica had arrived at its holder before the failure (t={t_failure:.6g} s)"
    lost_holders = sorted(r for r in dead if holder_of(r, topo) in dead)
    if lost_holders:
        return (
            f"rank(s) {lost_holders} and their holder(s) "
            f"{sorted({holder_of(r, topo) for r in lost_holders})} were lost together"
        )
    why = ""
    survivors = [r for r in sorted(ctrl.cluster.npus) if r not in dead]
    for gen in gens:
        has = ctrl.cluster.call_ok("replica_has", gen.step, ranks=survivors) if survivors else {}
        missing = sorted(r for r, ok in has.items() if not ok)
        states = {
            r: ctrl.cluster.call_ok("replica_give", r, gen.step, ranks=[holder_of(r, topo)])[
                holder_of(r, topo)
            ]
            for r in dead
        }
        unheld = sorted(r for r, st in states.items() if st is None)
        if not missing and not unheld:
            return gen, {r: st for r, st in states.items() if st is not None}
        why = f"step {gen.step}: no own copy on rank(s) {missing}, no held copy of rank(s) {unheld}"
    return why


def replica(ctrl: Controller, phase: PhaseState, step: int, out: dict[int, Outcome]) -> Recovery:
    """Recover from the failed ``step`` from in-memory replicas (Gemini-style): the lost ranks are
    restarted and fetch their state from the peers holding it; the survivors load their own copy.
    Falls back to the persistent checkpoint when no usable replica exists (journalled why)."""
    wall_start = time.monotonic()
    dead, detection = record_failure(ctrl, phase, step, out)
    t_death, t_detect, by = detection
    found = _replica_sources(ctrl, dead, t_death)
    if isinstance(found, str):
        ctrl.journal.emit("replica_unavailable", phase=phase.name, step=step, reason=found)
        return _from_storage(ctrl, phase, step, dead, detection, wall_start)
    gen, fetched = found
    replace_lost(ctrl, phase, dead, hot=False)
    policy = ctrl.scenario.policy.recovery
    t_restarted = t_detect + policy.restart_s
    ctrl.cluster.call_ok("reset", t_restarted)
    t_linked = ctrl.open_group(t_restarted, cold=False)
    ctrl.resumed_from(None)
    loaded = ctrl.cluster.call_ok("replica_restore", per_rank=lambda r: (gen.step, fetched.get(r)))
    topo = ctrl.cluster.topology
    load_s = max(
        n
        * ctrl.state_scale
        / (topo.link(holder_of(r, topo), r).bandwidth_Bps if r in fetched else topo.preset.hbm_Bps)
        for r, n in loaded.items()
    )
    t_resume = t_linked + load_s
    ctrl.forget_replicas_after(gen.step)
    ctrl.journal.emit(
        "resume",
        phase=phase.name,
        from_step=gen.step,
        t=t_resume,
        source="replica",
        fetched={str(r): holder_of(r, topo) for r in sorted(fetched)},
        bytes=sum(loaded.values()),
    )
    return Recovery(
        phase=phase.name,
        fail_step=step,
        t_death=t_death,
        t_detect=t_detect,
        detected_by=by,
        resume_step=gen.step + 1,
        t_resume=t_resume,
        breakdown={
            "detect_s": t_detect - t_death,
            "restart_s": policy.restart_s,
            "relink_s": t_linked - t_restarted,
            "load_s": load_s,
        },
        wall_start=wall_start,
        strategy="replica",
    )


def completed_in_place(
    ctrl: Controller,
    phase: PhaseState,
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
    ctrl.recoveries.append(rec)
    rec.complete(ctrl.journal, phase.name, t_done)
    return rec
