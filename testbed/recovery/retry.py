"""Recovery in place, without a restart: ``op_retry`` re-runs the failed gradient sync, ``step_retry``
the whole failed step from its in-memory snapshot (HCCL_OP_RETRY_ENABLE's hold and interval first).

``op_retry`` (A3 defaults: 1 retry, 5 s hold, 1 s interval): when a
collective fails by timeout on every rank and no process died, run it again
``hold_s + interval_s`` after the timeout fired, up to ``retries`` times; the
step's compute is kept. If that fails too, the job restarts.
"""

from __future__ import annotations

import time
from typing import Any

from testbed.actors.outcome import Outcome
from testbed.core.errors import CollectiveTimeout, LinkSetupTimeout
from testbed.recovery.context import Phase, RecoveryContext
from testbed.recovery.detect import completed_in_place, journal_failure, learned_watchdog, timeout_detect


def op_retry_applies(out: dict[int, Outcome]) -> bool:
    """Op retry handles a gradient sync that failed on every rank by timeout, with no rank dead.

    A collective inside the forward or backward pass (TP, PP, EP) is not
    retried: the step's state has moved on; step retry or a restart handles it.
    """
    return all(
        isinstance(o.error, CollectiveTimeout) and o.error.fields.get("phase") == "grad_sync"
        for o in out.values()
    )


#: Failures a step retry may cure: a collective that timed out or a link that took too long to set up.
TRANSIENT = (CollectiveTimeout, LinkSetupTimeout)


def step_retry_applies(out: dict[int, Outcome]) -> bool:
    """Step retry handles a step that failed on some rank by a transient error, with no process lost."""
    errors = [o.error for o in out.values() if o.error is not None]
    return bool(errors) and all(isinstance(e, TRANSIENT) for e in errors)


def _retry(
    ctx: RecoveryContext,
    phase: Phase,
    step: int,
    out: dict[int, Outcome],
    name: str,
    whole_step: bool,
    **event: Any,
) -> dict[int, Outcome]:
    """One retry in place, after HCCL's hold and interval: the step's gradient sync again
    (``retry_step``), or with ``whole_step`` the whole step from its snapshot (``rerun_step``); journalled
    as ``name``.

    Returns the attempt's outcomes; a success is journalled as a completed
    recovery (detect, hold, interval, and for a step retry the step's second run).
    """
    policy = ctx.scenario.policy.recovery.op_retry
    wall_start = time.monotonic()
    t_fail, t_detect, by = timeout_detect(out, learned_watchdog(ctx))
    journal_failure(ctx, phase, step, out, [], (t_fail, t_detect, by))
    t_retry = t_detect + policy.hold_s + policy.interval_s
    ctx.journal.emit(name, phase=phase.name, step=step, **event, t=t_retry)
    method = "rerun_step" if whole_step else "retry_step"
    out = ctx.cluster.call(method, step, t_retry, ranks=ctx.active_ranks())
    if not all(o.ok for o in out.values()):
        return out
    breakdown = {"hold_s": policy.hold_s, "interval_s": policy.interval_s}
    t_done = t_retry
    if whole_step:
        t_done = max(float(o.value["t"]) for o in out.values())
        breakdown["recompute_s"] = t_done - t_retry
    detection = (t_fail, t_detect, by)
    completed_in_place(ctx, phase, step, detection, t_retry, t_done, breakdown, name, wall_start)
    return out


def step_retry(ctx: RecoveryContext, phase: Phase, step: int, out: dict[int, Outcome]) -> dict[int, Outcome]:
    """Run the failed step again from the state it started from, after the same hold and interval as op
    retry, when every error is transient and no process was lost (else the outcomes as they were).

    Every rank restores its in-memory snapshot of the step's start (parameters,
    optimizer, scheduler, RNG, data cursor) and trains the step again; nothing
    is loaded from storage and no process restarts.
    """
    if not step_retry_applies(out):
        return out
    return _retry(ctx, phase, step, out, "step_retry", whole_step=True)


def op_retry(ctx: RecoveryContext, phase: Phase, step: int, out: dict[int, Outcome]) -> dict[int, Outcome]:
    """Re-run the step's collective after HCCL's hold and interval, up to ``retries`` times, when the
    gradient sync timed out on every rank (else the outcomes as they were).

    Returns the last attempt's outcomes.
    """
    for attempt in range(1, ctx.scenario.policy.recovery.op_retry.retries + 1):
        if not op_retry_applies(out):
            break
        out = _retry(ctx, phase, step, out, "op_retry", whole_step=False, attempt=attempt)
        if all(o.ok for o in out.values()):
            break
    return out
