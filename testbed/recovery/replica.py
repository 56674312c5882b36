"""Recovery from in-memory replicas (Gemini-style), and the replicas themselves.

Every ``policy.checkpoint.replica_every`` steps each rank copies its state to
host memory and sends it to its holder in another supernode
(:mod:`testbed.train.replica_store`). On a failure the lost ranks are
restarted and fetch their copy from the peer that holds it, the others load
their own; when no copy is usable (a rank and its holder lost together, no
copy arrived before the failure) the recovery falls back to a restart from
storage, journalled with the reason.
"""

from __future__ import annotations

import time

from testbed.actors.outcome import Outcome
from testbed.recovery.context import Phase, RecoveryContext
from testbed.recovery.detect import record_failure, replace_lost
from testbed.recovery.record import Recovery
from testbed.recovery.restart import from_storage
from testbed.train.replica_store import ReplicaGeneration, State, holder_of, usable


def _replica_sources(
    ctx: RecoveryContext, dead: list[int], t_failure: float
) -> tuple[ReplicaGeneration, dict[int, State]] | str:
    """The newest replica generation every rank can be restored from, with the lost ranks' copies
    fetched from their holders; or why there is none."""
    topo = ctx.cluster.topology
    gens = usable(ctx.replica_gens, t_failure)
    if not gens:
        return f"no in-memory replica had arrived at its holder before the failure (t={t_failure:.6g} s)"
    lost_holders = sorted(r for r in dead if holder_of(r, topo) in dead)
    if lost_holders:
        return (
            f"rank(s) {lost_holders} and their holder(s) "
            f"{sorted({holder_of(r, topo) for r in lost_holders})} were lost together"
        )
    why = ""
    survivors = [r for r in sorted(ctx.cluster.npus) if r not in dead]
    for gen in gens:
        has = ctx.cluster.call_ok("replica_has", gen.step, ranks=survivors) if survivors else {}
        missing = sorted(r for r, ok in has.items() if not ok)
        states = {
            r: ctx.cluster.call_ok("replica_give", r, gen.step, ranks=[holder_of(r, topo)])[
                holder_of(r, topo)
            ]
            for r in dead
        }
        unheld = sorted(r for r, st in states.items() if st is None)
        if not missing and not unheld:
            return gen, {r: st for r, st in states.items() if st is not None}
        why = f"step {gen.step}: no own copy on rank(s) {missing}, no held copy of rank(s) {unheld}"
    return why


def replica(ctx: RecoveryContext, phase: Phase, step: int, out: dict[int, Outcome]) -> Recovery:
    """Recover from the failed ``step`` from in-memory replicas (Gemini-style): the lost ranks are
    restarted and fetch their state from the peers holding it; the survivors load their own copy.
    Falls back to the persistent checkpoint when no usable replica exists (journalled why)."""
    wall_start = time.monotonic()
    dead, detection = record_failure(ctx, phase, step, out)
    t_death, t_detect, by = detection
    found = _replica_sources(ctx, dead, t_death)
    if isinstance(found, str):
        ctx.journal.emit("replica_unavailable", phase=phase.name, step=step, reason=found)
        return from_storage(ctx, phase, step, dead, detection, wall_start)
    gen, fetched = found
    replace_lost(ctx, phase, dead, hot=False)
    policy = ctx.scenario.policy.recovery
    t_restarted = t_detect + policy.restart_s
    ctx.cluster.call_ok("reset", t_restarted)
    t_linked = ctx.open_group(t_restarted, cold=False)
    ctx.resumed_from(None)
    loaded = ctx.cluster.call_ok("replica_restore", per_rank=lambda r: (gen.step, fetched.get(r)))
    topo = ctx.cluster.topology
    load_s = max(
        n
        * ctx.state_scale
        / (topo.link(holder_of(r, topo), r).bandwidth_Bps if r in fetched else topo.preset.hbm_Bps)
        for r, n in loaded.items()
    )
    t_resume = t_linked + load_s
    ctx.forget_replicas_after(gen.step)
    ctx.journal.emit(
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


def replicate(ctx: RecoveryContext, phase: str, step: int) -> ReplicaGeneration:
    """Every rank copies its state to host memory and sends it to its holder; the generation is
    usable from when the slowest transfer arrives (in the background: training does not wait)."""
    snaps = ctx.cluster.call_ok("replica_snapshot", step)
    topo = ctx.cluster.topology
    source = {holder_of(r, topo): r for r in snaps}
    ctx.cluster.call_ok("replica_hold", per_rank=lambda h: (source[h], step, snaps[source[h]]["state"]))
    t_ready = 0.0
    for r, snap in snaps.items():
        ctx.set_clock(r, float(snap["t"]))
        holder = holder_of(r, topo)
        bandwidth = topo.link(r, holder).bandwidth_Bps if holder != r else float("inf")
        t_ready = max(t_ready, float(snap["t"]) + snap["bytes"] * ctx.state_scale / bandwidth)
    gen = ReplicaGeneration(step, t_ready, sum(int(s["bytes"]) for s in snaps.values()))
    ctx.add_replica_generation(gen)
    ctx.journal.emit("replica_taken", phase=phase, step=step, bytes=gen.bytes, t=t_ready)
    return gen
