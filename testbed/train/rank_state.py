"""One NPU's state on its way out and back in: checkpoint shards, in-memory replicas, peer copies.

A mixin of :class:`testbed.train.npu.NPU`; every public method is one
control-plane call the controller or a recovery strategy makes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from testbed.collectives import Communicator, Endpoint
from testbed.collectives.select import MESH_MAX
from testbed.core.errors import CheckpointError, TestbedError
from testbed.job import figures
from testbed.job.pipeline import PipelineWaits, pipeline_waits
from testbed.train.checkpoint import Disk, audit, full_at, read_component, room, write_shard
from testbed.train.knobs import Knobs
from testbed.train.rank_spec import RankSpec
from testbed.train.replica_store import ReplicaStore, State, state_bytes


class RankState:
    """Save, restore and copy the rank's workload state."""

    rank: int
    spec: RankSpec
    ep: Endpoint
    workload: Any
    knobs: Knobs
    replicas: ReplicaStore
    comm: Communicator | None
    groups: dict[str, Communicator]
    sync_algo: dict[str, str]
    _hook: Callable[[str], None]  # where a death armed by a fault happens (RankFaults)
    _take_armed: Callable[[str], None]  # where a preemption notice armed for a point comes (RankPreemption)

    def _group(self) -> Communicator:
        """The world group of the current epoch (an error if none is open)."""
        if self.comm is None:
            raise TestbedError(f"rank {self.rank}: no group open; call open_group first", rank=self.rank)
        return self.comm

    def _whole_state(self) -> State:
        return {c: self.workload.state(c) for c in self.workload.components}

    def state_scale(self) -> float:
        """Modelled bytes of state per byte this rank holds: the job's checkpoint bytes per NPU over
        this rank's own (``workload.state_scale`` when the scenario has no job)."""
        job = self.spec.job
        if job is None:
            return self.spec.state_scale
        per_npu = sum(figures.checkpoint_bytes(job).values()) / job.world
        return per_npu / max(1, state_bytes(self._whole_state()))

    def compute_scale(self) -> float:
        """Modelled FLOPs per FLOP this rank's proxy computes: the job's FLOPs per NPU per step over
        the proxy's (``workload.compute_scale`` when the scenario has no job)."""
        if self.spec.job is None:
            return self.spec.compute_scale
        return figures.hardware_flops_per_npu(self.spec.job) / max(1.0, float(self.workload.flops_per_step()))

    def job_scale(self) -> dict[str, tuple[float, float, int, int]]:
        """Per group this rank's collectives run in: (the job's latency seconds per call of the
        proxy's, the job's bandwidth seconds per byte of the proxy's, the bytes of one of the job's
        calls, the ranks of the job's group). The job's side is what its NPU of the stage this
        rank's stands for spends per step on that group's collectives on an idle fabric
        (:func:`figures.rank_collectives`); the proxy's, what its ``sync_plan`` (one call per group)
        and ``traffic`` (if it has one) say it hands them per step. Empty with no job."""
        job = self.spec.job
        if job is None:
            return {}
        proxy = {group: (float(n), 1.0) for group, n in self.workload.sync_plan().items()}
        proxy.update(getattr(self.workload, "traffic", dict)())
        run = self.spec.parallel()
        stage = figures.job_stage(run.coords(self.rank).pp, run.pp, job.layout.pp)
        topo = figures.job_topology(job, self.spec.topology)
        wanted = figures.rank_collectives(job, stage, topo, self.spec.algorithm)
        return {
            g: (w.latency_s / calls, w.transfer_s / nbytes, w.per_call, w.group)
            for g, (nbytes, calls) in proxy.items()
            if nbytes and calls and (w := wanted.get(g)) is not None
        }

    def pipeline_waits(self) -> PipelineWaits | None:
        """What this rank's pipeline stage waits per step as the job's stage it stands for would (the
        job's bubble and pipeline sends, :mod:`testbed.job.pipeline`); None with no job, or no
        pipeline in the proxy."""
        job, run = self.spec.job, self.spec.parallel()
        if job is None or run.pp == 1:
            return None
        stage = figures.job_stage(run.coords(self.rank).pp, run.pp, job.layout.pp)
        return pipeline_waits(job, figures.job_topology(job, self.spec.topology), stage, self.spec.algorithm)

    def job_scales(self) -> dict[str, Any]:
        """This rank's derived scales and the proxy figures they divide (asked once at start)."""
        return {
            "compute_scale": self.compute_scale(),
            "state_scale": self.state_scale(),
            "job_scale": {g: list(v) for g, v in self.job_scale().items()},
            "proxy_flops": float(self.workload.flops_per_step()),
            "proxy_state_bytes": float(state_bytes(self._whole_state())),
        }

    def _charge_copy(self, nbytes: int) -> None:
        """Copying ``nbytes`` of device state to host memory costs ``bytes x state_scale / hbm_Bps``."""
        clock = self.ep.clock
        clock.advance_to(clock.t + nbytes * self.state_scale() / self.spec.topology.preset.hbm_Bps)

    def save_shard(self, tmp_dir: str, include: list[str]) -> dict[str, Any]:
        """Barrier, then write this rank's included components into the checkpoint's temp dir."""
        world = self._group()
        # the links of the world group's warmed-up algorithm (if it has one) are already set up
        warmed = [self.sync_algo[n] for n in self.sync_algo if self.groups[n] is world]
        if warmed or world.size <= MESH_MAX:
            world.barrier(warmed[0] if warmed else "auto")
        else:  # a large world: the model-parallel group, then the data-parallel replicas; together
            for name in ("model", "replica"):  # they span every axis, on few links (most up already)
                self.groups[name].barrier(self.sync_algo.get(name, "auto"))
        comps = {c: self.workload.state(c) for c in include if c in self.workload.components}
        if self.knobs.storage_full:
            raise CheckpointError(
                f"rank {self.rank}: writing its checkpoint shard failed: [Errno 28] No space left on device",
                rank=self.rank,
                errno=28,
            )
        entries = write_shard(Path(tmp_dir), self.rank, comps, hook=self._hook, disk=self._disk())
        return {
            "rank": self.rank,
            "entries": entries,
            "t": self.ep.clock.t,
            "audit": audit(comps),
            "fault_hits": self.ep.take_hits(),
        }

    def _disk(self) -> Disk:
        """The checkpoint storage as this rank's writes meet it: full at a point, or with room."""
        if not self.knobs.disk_full:
            return room
        point, code = self.knobs.disk_full.split(":")
        return full_at(point, int(code))

    def restore(self, files: dict[str, list[str]]) -> int:
        """Load checkpoint components (``component -> [file, sha256]``); returns the bytes read from
        storage: the files' sizes, as their write counted them (not the arrays', which leave out the
        files' headers: a load would be shorter than its write)."""
        nbytes = 0
        for i, (comp, (file, sha)) in enumerate(sorted(files.items())):
            if i == len(files) // 2:  # half-way through the load: a notice armed for it comes here
                self._take_armed("load.mid")
            arrays = read_component(file, sha)
            self.workload.load(comp, arrays)
            nbytes += Path(file).stat().st_size
        return nbytes

    # --- in-memory replicas (testbed.train.replica_store) ----------------------------------
    def replica_snapshot(self, step: int) -> dict[str, Any]:
        """Copy this rank's whole state to host memory (charged ``bytes / hbm_bandwidth``), keep it,
        and return it for the holder; the caller sends it on."""
        state = {
            c: {k: np.array(a, copy=True) for k, a in arrays.items()}
            for c, arrays in self._whole_state().items()
        }
        nbytes = state_bytes(state)
        self._charge_copy(nbytes)
        self.replicas.keep_own(step, state)
        return {"rank": self.rank, "state": state, "bytes": nbytes, "t": self.ep.clock.t}

    def replica_hold(self, rank: int, step: int, state: State) -> None:
        """Hold ``rank``'s replica of ``step`` in this process's memory."""
        self.replicas.hold(rank, step, state)

    def replica_give(self, rank: int, step: int) -> State | None:
        """The replica of ``rank`` at ``step`` this process holds (None if it has none)."""
        return self.replicas.held.get((rank, step))

    def replica_has(self, step: int) -> bool:
        """Whether this process still has its own copy of ``step``."""
        return step in self.replicas.own

    def replica_restore(self, step: int, state: State | None = None) -> int:
        """Load the replica of ``step``: this rank's own copy, or ``state`` fetched from its holder.
        Returns the bytes loaded."""
        if state is None:
            if step not in self.replicas.own:
                raise TestbedError(f"rank {self.rank}: no copy of step {step} in memory", rank=self.rank)
            state = self.replicas.own[step]
        return self.load_state(state)

    def export_state(self, components: list[str]) -> State:
        """A copy of ``components`` of this rank's state (an elastic rejoin copies them to a peer)."""
        return {c: self.workload.state(c) for c in components if c in self.workload.components}

    def load_state(self, state: State) -> int:
        """Load components copied from a replica or a peer; returns the bytes loaded."""
        for component, arrays in state.items():
            self.workload.load(component, {k: np.array(a, copy=True) for k, a in arrays.items()})
        return state_bytes(state)

    def digest(self) -> str:
        """sha256 of this rank's parameters."""
        return str(self.workload.params_digest())

    def keep_final(self) -> None:
        """Keep a copy of this rank's whole state in host memory (it outlives a reset): the main run's
        final state, to set beside the reference run's with :meth:`difference_from_kept`."""
        whole = self._whole_state()
        self.replicas.final = {
            c: {k: np.array(a, copy=True) for k, a in arrays.items()} for c, arrays in whole.items()
        }

    def difference_from_kept(self) -> dict[str, dict[str, Any]]:
        """Per component, how far this rank's state is from the kept one: the largest absolute and
        relative difference over its leaves, how many leaves differ, and the leaf of the largest."""
        kept = self.replicas.final or {}
        return {c: leaf_difference(kept.get(c, {}), arrays) for c, arrays in self._whole_state().items()}

    def final_state(self) -> State:
        """A copy of this rank's whole state: a reference run's end, kept for later runs to set beside
        theirs with :meth:`difference_from` (a sweep's points share one reference)."""
        return {
            c: {k: np.array(a, copy=True) for k, a in arrays.items()}
            for c, arrays in self._whole_state().items()
        }

    def difference_from(self, reference: State) -> dict[str, dict[str, Any]]:
        """:meth:`difference_from_kept` with this rank's state as the kept one and ``reference`` (a
        :meth:`final_state`) as the reference run's."""
        mine = self._whole_state()
        return {c: leaf_difference(mine.get(c, {}), arrays) for c, arrays in reference.items()}


def leaf_difference(kept: dict[str, np.ndarray], now: dict[str, np.ndarray]) -> dict[str, Any]:
    """How ``kept`` differs from ``now``, leaf by leaf: ``max_abs``, ``max_rel`` (the gap over the
    larger magnitude of the two, so a leaf that is zero on one side gives 1.0), ``leaves`` (how many
    differ), ``leaf`` (the one with the largest absolute gap, or None) and ``mismatched`` (leaves
    missing on one side or of another shape: counted, not measured)."""
    max_abs, max_rel, differ, worst = 0.0, 0.0, 0, None
    mismatched: list[str] = []
    for name in sorted(set(kept) | set(now)):
        a, b = kept.get(name), now.get(name)
        if a is None or b is None or a.shape != b.shape:
            mismatched.append(name)
            continue
        x, y = a.astype(np.float64), b.astype(np.float64)
        gap = np.abs(x - y)
        if not gap.size or not np.any(gap > 0):
            continue
        differ += 1
        scale = np.maximum(np.abs(x), np.abs(y))
        rel = float(np.max(np.divide(gap, scale, out=np.zeros_like(gap), where=scale > 0)))
        if worst is None or float(np.max(gap)) > max_abs:
            max_abs, worst = float(np.max(gap)), name
        max_rel = max(max_rel, rel)
    return {
        "max_abs": max_abs,
        "max_rel": max_rel,
        "leaves": differ + len(mismatched),
        "leaf": worst,
        "mismatched": mismatched,
    }
