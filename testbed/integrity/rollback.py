"""Going back after a detected corruption: to the newest checkpoint a hash verified (or the newest
before the detected step), with the attributed NPU excluded when it has struck out.

Without an exclusion the rollback happens in place: every rank loads the
checkpoint (``bytes / storage bandwidth``, the storage being shared) and
training goes on from the step after it. An exclusion replaces the NPU's
process by a new one (standing for a spare NPU: the corruption stays with
the excluded one) and restarts the job (``restart_s``), re-links and loads.
With no checkpoint to go back to, training starts again from step 1.

Checkpoints of later steps describe a future that is abandoned: they are
moved aside (``.abandoned``) so that no later resume can pick one up.
"""

from __future__ import annotations

import time
from pathlib import Path

from testbed.core.errors import RecoveryFailed
from testbed.integrity.detectors import Alarm
from testbed.integrity.inspector import Inspector
from testbed.recovery.context import Phase, RecoveryContext
from testbed.recovery.detect import replace_lost
from testbed.recovery.record import Recovery
from testbed.train import checkpoint as ckpt


def _abandon_after(root: Path, step: int) -> list[int]:
    """Move aside every committed checkpoint of a step after ``step``; returns their steps."""
    gone = []
    for s, path in ckpt.committed(root):
        if s > step:
            path.rename(path.with_name(path.name + ".abandoned"))
            gone.append(s)
    return gone


def roll_back(
    ctx: RecoveryContext,
    inspector: Inspector,
    phase: Phase,
    step: int,
    alarm: Alarm,
    exclude: tuple[int, ...],
    t_detect: float,
) -> Recovery:
    """Go back from the corruption detected after ``step``: exclude ``exclude``, restore, journal."""
    wall_start = time.monotonic()
    policy = inspector.policy
    inspector.rollbacks += 1
    if inspector.rollbacks > policy.max_rollbacks:
        raise RecoveryFailed(
            f"{inspector.rollbacks} rollbacks after silent corruption, past policy.integrity.max_rollbacks "
            f"= {policy.max_rollbacks}: a corruption that persists needs strikes: {{count: N}} to exclude "
            "its NPU",
            step=step,
        )
    assert phase.ckpt_root is not None
    verified = inspector.verified if policy.restore == "verified" else None
    found, skipped = ckpt.newest(phase.ckpt_root, before=step + 1, only=verified)
    for reason in skipped:
        ctx.journal.emit("checkpoint_skipped", phase=phase.name, reason=reason)
    if found is None:
        ctx.journal.emit("warning", phase=phase.name, step=step, message=_nothing_to_restore(ctx, inspector))
    resume_step = found.step + 1 if found is not None else 1
    abandoned = _abandon_after(phase.ckpt_root, resume_step - 1)
    if abandoned:
        ctx.journal.emit("checkpoint_abandoned", phase=phase.name, steps=abandoned)
    breakdown: dict[str, float] = {}
    t = t_detect
    if exclude:
        replace_lost(ctx, phase, list(exclude), hot=False)
        ctx.journal.emit("npu_excluded", phase=phase.name, step=step, ranks=list(exclude))
        breakdown["restart_s"] = ctx.scenario.policy.recovery.restart_s
        t += breakdown["restart_s"]
    if exclude or found is None:  # new processes, or back to the start: every rank afresh, re-linked
        ctx.cluster.call_ok("reset", t)
        t_linked = ctx.open_group(t)
        breakdown["relink_s"], t = t_linked - t, t_linked
    components: dict[str, list[str]] = {}
    if found is not None:
        restore = ctx.scenario.policy.checkpoint.restore
        loaded = ctx.cluster.call_ok("restore", per_rank=lambda r: (found.files_of(r, restore),))
        breakdown["load_s"] = sum(loaded.values()) * ctx.state_scale / ctx.storage_Bps
        t += breakdown["load_s"]
        components = {str(r): sorted(found.files_of(r, restore)) for r in sorted(loaded)}
    for r in ctx.active_ranks():
        ctx.set_clock(r, max(t, 0.0))
    skipping = inspector.skips.skip_after(resume_step - 1, step) if policy.skip_batches else 0
    inspector.went_back(resume_step - 1)
    ctx.forget_replicas_after(resume_step - 1)
    ctx.resumed_from(found.manifest if found is not None else None)
    ctx.journal.emit(
        "resume",
        phase=phase.name,
        from_step=resume_step - 1,
        t=t,
        components=components,
        checkpoint=found is not None,
        source="checkpoint",
        verified=found is not None and found.step in inspector.verified,
        **({"skips_batches": skipping} if skipping else {}),
    )
    return Recovery(
        phase=phase.name,
        fail_step=step,
        t_death=t_detect,
        t_detect=t_detect,
        detected_by=alarm.detector,
        resume_step=resume_step,
        t_resume=t,
        breakdown=breakdown,
        wall_start=wall_start,
        strategy="exclusion" if exclude else "rollback",
    )


def _nothing_to_restore(ctx: RecoveryContext, inspector: Inspector) -> str:
    """Why no checkpoint could be restored, and what would give one."""
    keep = ctx.scenario.policy.checkpoint.keep
    if inspector.policy.restore == "verified" and not inspector.verified:
        return (
            "no checkpoint was verified yet (no hash had agreed at a checkpoint's step): training starts "
            "again from step 1; align hash.every with policy.checkpoint.every"
        )
    if inspector.policy.restore == "verified":
        return (
            f"no checkpoint of a verified step (steps {sorted(inspector.verified)}) is left "
            f"(policy.checkpoint.keep = {keep}, every = {ctx.scenario.policy.checkpoint.every}): training "
            "starts again from step 1; make hash.every a multiple of checkpoint.every"
        )
    return "no checkpoint before the detected step: training starts again from step 1"
