"""Recovery by restart, as a job-level restart does on a real cluster (``restart``, ``hot_spare``).

1. detect (:mod:`testbed.recovery.detect`);
2. restart: the lost NPU processes are really re-created (or, with
   ``hot_spare``, running spares of the same supernode take them: ``spare_s``
   instead of ``restart_s``); every rank starts afresh (initial state);
3. re-link: a new group epoch sets every link up again (seeded setup model); a link still
   dropping every message fails it, and the ranks restart again (``relink_failed``);
4. load: the newest committed checkpoint that verifies is read by every rank,
   charged ``bytes / storage bandwidth`` (the storage is shared);
5. recompute: the steps between the checkpoint and the failure are run again;
   their virtual time is measured when the run passes the failed step's predecessor.
"""

from __future__ import annotations

import time

from testbed.actors.outcome import Outcome
from testbed.core.errors import CollectiveTimeout
from testbed.recovery.context import Phase, RecoveryContext
from testbed.recovery.detect import record_failure, replace_lost
from testbed.recovery.record import Recovery
from testbed.train import checkpoint as ckpt


def restart(ctx: RecoveryContext, phase: Phase, step: int, out: dict[int, Outcome]) -> Recovery:
    """Recover from the failed ``step`` by restarting from the newest committed checkpoint."""
    wall_start = time.monotonic()
    dead, detection = record_failure(ctx, phase, step, out)
    return from_storage(ctx, phase, step, dead, detection, wall_start)


def hot_spare(ctx: RecoveryContext, phase: Phase, step: int, out: dict[int, Outcome]) -> Recovery:
    """A restart in which running spares of the lost ranks' supernodes take their place."""
    wall_start = time.monotonic()
    dead, detection = record_failure(ctx, phase, step, out)
    return from_storage(ctx, phase, step, dead, detection, wall_start, hot=True)


def _link_again(ctx: RecoveryContext, phase: Phase, step: int, t0: float, cost: float) -> float:
    """Open the restarted group at ``t0``; when it is ready. A link that still drops every message (a
    partition or a link down, not healed yet) fails the re-link as it failed the step: as a real
    launcher's next restart would, that counts against ``max_restarts`` (``relink_failed``) and the
    ranks restart ``cost`` after it, until the links carry again or the restarts run out."""
    while True:
        try:
            return ctx.open_group(t0)
        except CollectiveTimeout as exc:
            if not exc.fields.get("true_timeout"):
                raise
            phase.restarts += 1
            if phase.restarts > ctx.scenario.policy.recovery.max_restarts:
                raise
            t_failed = float(exc.fields.get("t", t0))
            ctx.journal.emit(
                "relink_failed",
                phase=phase.name,
                step=step,
                t=t_failed,
                restarts=phase.restarts,
                error=str(exc),
            )
            t0 = t_failed + cost
            ctx.cluster.call_ok("reset", t0)


def from_storage(
    ctx: RecoveryContext,
    phase: Phase,
    step: int,
    dead: list[int],
    detection: tuple[float, float, str],
    wall_start: float,
    hot: bool = False,
) -> Recovery:
    """Replace the lost ranks (with spares when ``hot``), restart every rank, re-link, load the newest
    verified checkpoint."""
    t_death, t_detect, by = detection
    policy = ctx.scenario.policy.recovery
    ctx.set_shrunk(None)  # a restart brings every rank back, whatever an elastic shrink left out
    all_spares = replace_lost(ctx, phase, dead, hot)
    # with every lost rank taken by a running spare, no process restarts: the spare is activated
    activation, cost = ("spare_s", policy.spare_s) if all_spares else ("restart_s", policy.restart_s)
    t_restarted = t_detect + cost
    ctx.cluster.call_ok("reset", t_restarted)
    t_linked = _link_again(ctx, phase, step, t_restarted, cost)
    ctx.reached("recovery.relinked")
    assert phase.ckpt_root is not None
    trusted = ctx.trusted_steps()  # under policy.integrity: only a checkpoint a hash verified
    found, skipped = ckpt.newest(phase.ckpt_root, persisted_by=t_death, only=trusted)
    for reason in skipped:
        ctx.journal.emit("checkpoint_skipped", phase=phase.name, reason=reason)
    load_s, resume_step, components = 0.0, 1, {}
    if found is not None:
        restore = ctx.scenario.policy.checkpoint.restore
        loaded = ctx.cluster.call_ok("restore", per_rank=lambda r: (found.files_of(r, restore),))
        load_s = sum(loaded.values()) * ctx.state_scale / ctx.storage_Bps
        resume_step = found.step + 1
        components = {str(r): sorted(found.files_of(r, restore)) for r in sorted(loaded)}
    t_resume = t_linked + load_s
    ctx.forget_replicas_after(resume_step - 1)
    ctx.resumed_from(found.manifest if found is not None else None)
    ctx.journal.emit(
        "resume",
        phase=phase.name,
        from_step=resume_step - 1,
        t=t_resume,
        components=components,
        checkpoint=found is not None,
        source="checkpoint",
        **({"verified": found is not None and found.step in trusted} if trusted is not None else {}),
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
