"""Elastic recovery: the job drops the lost rank's data-parallel replica, trains on, and heals.

When ranks die and ``policy.recovery.strategy`` is ``elastic``:

1. detect, as for a restart;
2. shrink: every rank of a data-parallel index that lost a rank steps aside
   (the lost ones are replaced by new processes at once, but a replacement is
   ready only ``replace_s`` after detection: a new node has to come up);
3. re-link: a new group epoch among the remaining ranks (DP groups without
   the dropped indices);
4. the failed step runs again on the remaining ranks from the state it
   started from (kept in memory); gradients are averaged over the replicas
   that train, so each step now sees a smaller global batch;
5. rejoin, at the first step boundary after the replacement is ready: each
   rank of the dropped replicas gets parameters, optimizer, LR scheduler and
   data cursor from its peer at the same model-parallel position in a replica
   that kept training (``bytes / link bandwidth``, over the fabric), keeps its
   own dropout RNG, and a new group epoch over every rank follows.

Checkpoints are deferred while replicas are out (a checkpoint of a shrunk
job would hold stale shards). The training trajectory differs from an
uninterrupted run (steps ran on fewer samples), so ``matches_uninterrupted``
is not a check to expect of it; goodput counts a shrunk step at the share of
replicas that trained. Elastic needs ``dp >= 2`` and no ZeRO sharding; any
other failure (nothing died, every replica lost, sharded optimizer state)
falls back to a restart, journalled with the reason.
"""

from __future__ import annotations

import time
from dataclasses import replace

from testbed.actors.outcome import Outcome, is_death
from testbed.core.errors import RankHung
from testbed.recovery.context import Phase, RecoveryContext
from testbed.recovery.detect import completed_in_place, record_failure, replace_lost
from testbed.recovery.record import Shrunk

#: What a rejoining rank copies from its peer (its own dropout RNG stays its own).
REJOIN_COMPONENTS = ["params", "optimizer", "lr_scheduler", "data_cursor"]


def lost_ranks(out: dict[int, Outcome]) -> list[int]:
    """Ranks whose process died or froze in this call."""
    return sorted(r for r, o in out.items() if is_death(o.error) or isinstance(o.error, RankHung))


def why_not(ctx: RecoveryContext, out: dict[int, Outcome]) -> str | None:
    """Why an elastic shrink cannot handle this failure (None: it can)."""
    lost = lost_ranks(out)
    if not lost:
        return "no rank was lost (elastic handles lost ranks; the failure was a timeout or an error)"
    layout = ctx.scenario.workload.layout()
    if int(ctx.scenario.workload.options.get("zero", 0) or 0):
        return "zero: 1 shards the optimizer state over the data-parallel group; it cannot shrink"
    if ctx.shrunk is not None:
        return "data-parallel replicas are already out; a second loss before the rejoin restarts the job"
    dropped = {layout.coords(r).dp for r in lost}
    if len(dropped) >= layout.dp:
        return f"every data-parallel replica lost a rank (dp = {layout.dp}); nothing is left to train on"
    return None


def shrink_if_able(
    ctx: RecoveryContext, phase: Phase, step: int, out: dict[int, Outcome]
) -> dict[int, Outcome]:
    """Shrink when an elastic shrink can handle this failure; else journal why not and leave the
    outcomes as they were (a restart follows)."""
    reason = why_not(ctx, out)
    if reason is None:
        return shrink(ctx, phase, step, out)
    ctx.journal.emit("elastic_unavailable", phase=phase.name, step=step, reason=reason)
    return out


def shrink(ctx: RecoveryContext, phase: Phase, step: int, out: dict[int, Outcome]) -> dict[int, Outcome]:
    """Drop the lost ranks' DP replicas, re-link the rest and run ``step`` again on them.

    Returns the step's outcomes on the remaining ranks (a success is
    journalled as a completed ``elastic`` recovery).
    """
    wall_start = time.monotonic()
    lost, (t_fail, t_detect, by) = record_failure(ctx, phase, step, out)
    layout = ctx.scenario.workload.layout()
    dropped = sorted({layout.coords(r).dp for r in lost})
    replace_lost(ctx, phase, lost, hot=False)
    keep = tuple(d for d in range(layout.dp) if d not in dropped)
    policy = ctx.scenario.policy.recovery
    ctx.set_shrunk(Shrunk(keep, t_detect + policy.replace_s, step))
    ctx.journal.emit(
        "elastic_shrink",
        phase=phase.name,
        step=step,
        dropped_dp=dropped,
        dp_active=list(keep),
        ranks_out=ctx.ranks_out(),
        t_ready=t_detect + policy.replace_s,
        t=t_detect,
    )
    t_linked = ctx.open_group(t_detect, cold=False)
    out = ctx.cluster.call("rerun_step", step, t_linked, ranks=ctx.active_ranks())
    if all(o.ok for o in out.values()):
        t_done = max(float(o.value["t"]) for o in out.values())
        parts = {"relink_s": t_linked - t_detect, "recompute_s": t_done - t_linked}
        detection = (t_fail, t_detect, by)
        completed_in_place(ctx, phase, step, detection, t_linked, t_done, parts, "elastic", wall_start)
    return out


def rejoin(ctx: RecoveryContext, phase: Phase, step: int) -> float:
    """The dropped replicas come back before ``step``: state from their peers, then a new group epoch
    over every rank. Returns when training may go on (virtual)."""
    assert ctx.shrunk is not None
    layout = ctx.scenario.workload.layout()
    back = ctx.ranks_out()
    donor_dp = ctx.shrunk.dp_active[0]
    donor = {r: layout.rank_of(replace(layout.coords(r), dp=donor_dp)) for r in back}
    states = ctx.cluster.call_ok("export_state", REJOIN_COMPONENTS, ranks=sorted(set(donor.values())))
    loaded = ctx.cluster.call_ok("load_state", per_rank=lambda r: (states[donor[r]],), ranks=back)
    topo = ctx.cluster.topology
    load_s = max(n * ctx.state_scale / topo.link(donor[r], r).bandwidth_Bps for r, n in loaded.items())
    t0 = max(ctx.now(), ctx.shrunk.t_ready)
    t_ready, fail_step = ctx.shrunk.t_ready, ctx.shrunk.fail_step
    ctx.set_shrunk(None)
    t_linked = ctx.open_group(t0, cold=False)
    t = t_linked + load_s
    ctx.journal.emit(
        "elastic_rejoin",
        phase=phase.name,
        step=step,
        fail_step=fail_step,
        ranks=back,
        donors={str(r): d for r, d in sorted(donor.items())},
        bytes=sum(loaded.values()),
        t_ready=t_ready,
        relink_s=t_linked - t0,
        load_s=load_s,
        t=t,
    )
    return t
