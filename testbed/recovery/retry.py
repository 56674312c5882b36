"""Recovery in place, without a restart: ``op_retry`` re-runs the failed gradient sync, ``step_retry``
the whole failed step from its in-memory snapshot (HCCL_OP_RETRY_ENABLE's hold and interval first).

``op_retry`` (A3 defaults: 1 retry, 5 s hold, 1 s interval): when a
collective fails by timeout on every rank and no process died, run it again
``hold_s + interval_s`` after the timeout fired, up to ``retries`` times; the
step's compute is kept. If that fails too, the job restarts.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from testbed.actors.cluster import Outcome
from testbed.core.errors import CollectiveTimeout, LinkSetupTimeout
from testbed.recovery.restart import completed_in_place, journal_failure, learned_watchdog, timeout_detect

if TYPE_CHECKING:
    from testbed.run.controller import Controller, PhaseState


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
    t_fail, t_detect, by = timeout_detect(out, learned_watchdog(ctrl))
    journal_failure(ctrl, phase, step, out, [], (t_fail, t_detect, by))
    t_retry = t_detect + policy.hold_s + policy.interval_s
    ctrl.journal.emit(strategy, phase=phase.name, step=step, **event, t=t_retry)
    method = "rerun_step" if strategy == "step_retry" else "retry_step"
    out = ctrl.cluster.call(method, step, t_retry, ranks=ctrl.active_ranks())
    if not all(o.ok for o in out.values()):
        return out
    breakdown = {"hold_s": policy.hold_s, "interval_s": policy.interval_s}
    t_done = t_retry
    if strategy == "step_retry":
        t_done = max(float(o.value["t"]) for o in out.values())
        breakdown["recompute_s"] = t_done - t_retry
    detection = (t_fail, t_detect, by)
    completed_in_place(ctrl, phase, step, detection, t_retry, t_done, breakdown, strategy, wall_start)
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
