"""One NPU: the training program of one rank, run inside its own Ray actor process.

The class is plain Python (testable without Ray); :mod:`testbed.actors.cluster`
wraps it as an actor. It owns the rank's data plane, virtual clock and
workload state, and carries out what the controller asks: open the group,
train a step, write or restore a checkpoint shard, die at an armed point.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from testbed.collectives import Communicator, Endpoint, abort_job, choose
from testbed.core.errors import CheckpointError, DeviceOOM, HarnessHang, TestbedError
from testbed.fabric.clock import RankClock
from testbed.fabric.dataplane import DROP, DataPlane
from testbed.fabric.linkfaults import LinkFaultTable
from testbed.topology.layout import Layout
from testbed.topology.presets import Topology
from testbed.train.checkpoint import audit, read_component, write_shard
from testbed.train.device_memory import Device
from testbed.train.knobs import Knobs
from testbed.train.replica_store import ReplicaStore, State, state_bytes
from testbed.train.step_context import StepContext, open_groups


@dataclass(frozen=True)
class RankSpec:
    """Everything an NPU needs to know at start, identical for every rank."""

    topology: Topology
    seed: int
    #: makes the rank's workload from (options, seed, rank, layout): a class of :mod:`workloads`,
    #: handed in (pickled by reference) so that the NPU never looks the workload up by name
    workload_factory: Callable[..., Any]
    workload_options: dict[str, Any]
    connect_timeout_s: float
    exec_timeout_s: float
    algorithm: str = "auto"
    warmup: bool = True
    guard_s: float = 60.0
    host: str = "127.0.0.1"
    socket_dir: str | None = None
    device_bytes: int = 64 * 2**20
    memory_policy: str = "none"
    pool_share: float = 0.25
    layout: Layout | None = None
    compute_scale: float = 1.0
    state_scale: float = 1.0  # modelled bytes of state per byte held (snapshot times only)
    step_snapshot: bool = False  # keep each step's starting state in memory (for step retry)
    setup_scale: float = 1.0  # groups set links up as if this many times larger (cluster.modelled_npus)

    def parallel(self) -> Layout:
        """The parallel layout (all data-parallel unless given)."""
        return self.layout or Layout(dp=self.topology.world)


@dataclass(frozen=True)
class _PendingStep:
    """A step whose forward and backward are done and whose gradient sync has not yet succeeded."""

    step: int
    loss: float | None
    samples: int
    t0: float
    compute0: float
    wait0: float
    bubble0: float
    ctx: StepContext
    grads: dict[str, np.ndarray]
    buffers: tuple[tuple[str, int], ...] = ()
    waits0: tuple[tuple[str, float], ...] = ()  # the rank's waits by collective when the step began


def _make_workload(spec: RankSpec, rank: int) -> Any:
    return spec.workload_factory(spec.workload_options, spec.seed, rank, spec.parallel())


class NPU:
    """The rank's program; every public method is one control-plane call."""

    def __init__(self, rank: int | None, spec: RankSpec, supervisor: Any = None) -> None:
        """Start as ``rank``, or (``None``) as a hot spare: a running process that has no rank yet."""
        self.spec = spec
        self.supervisor = supervisor
        self.rank = -1
        self.replicas = ReplicaStore()  # host memory: outlives a reset, dies with the process
        if rank is not None:
            self._become(rank)

    def adopt(self, rank: int) -> dict[str, Any]:
        """A hot spare takes ``rank`` (whose process died): it becomes a fresh NPU of that rank."""
        if self.rank >= 0:
            raise TestbedError(
                f"rank {self.rank} cannot adopt rank {rank}: it is not a spare", rank=self.rank
            )
        self._become(rank)
        return self.info()

    def _become(self, rank: int) -> None:
        spec = self.spec
        self.rank = rank
        self.dataplane = DataPlane(rank, spec.host, spec.guard_s, spec.socket_dir)
        self.ep = Endpoint(
            rank=rank,
            dataplane=self.dataplane,
            clock=RankClock(),
            topology=spec.topology,
            seed=spec.seed,
            connect_timeout_s=spec.connect_timeout_s,
            exec_timeout_s=spec.exec_timeout_s,
            hook=self._hook,
            setup_scale=spec.setup_scale,
        )
        self.workload = _make_workload(spec, rank)
        self.device = self._new_device()
        self._pins: dict[str, list[tuple[str, int]]] = {}
        self.comm: Communicator | None = None
        self.groups: dict[str, Communicator] = {}
        self.sync_algo: dict[str, str] = {}
        self.knobs = Knobs()
        self._snapshot: tuple[int, dict[str, dict[str, np.ndarray]]] | None = None
        self._placed: tuple[tuple[str, int], ...] = ()
        self._pending: _PendingStep | None = None
        self._kill_at: tuple[int, str] | None = None
        self._action = "kill"

    def _new_device(self) -> Device:
        """Fresh device memory holding the workload's persistent tensors."""
        topo, spec = self.spec.topology, self.spec
        device = Device(
            spec.device_bytes,
            self.rank,
            spec.memory_policy,
            topo.preset.hbm_Bps,
            pool_capacity=int(spec.pool_share * spec.device_bytes * (topo.npus_per_supernode - 1)),
            pool_Bps=topo.preset.intra.bandwidth_Bps,
        )
        for tag, nbytes in self.workload.persistent_bytes().items():
            device.alloc(nbytes, tag)
        return device

    def _place(self, step: int) -> tuple[tuple[str, int], ...]:
        """Place the step's buffers as the framework would; an OOM fails this rank's step."""
        b = self.workload.step_bytes(step)
        dev = self.device
        try:
            ws = dev.alloc(b.workspace, "workspace") if b.workspace else None
            acts = dev.alloc(b.activations, "activations")
            if b.keep:  # made during the forward pass, while the workspace is alive: it lands past it
                dev.alloc(b.keep, f"keep{step}")
            if ws is not None:
                dev.free(ws)
            grads = dev.alloc(b.grads, "grads")
            dev.free(acts)
            comm = dev.alloc(b.comm, "comm")
        except DeviceOOM as err:
            t = self.clock.t
            raise DeviceOOM(
                err.message, **{**err.fields, "t": t, "wait_start": t, "how": "direct", "step": step}
            ) from None
        finally:
            self.clock.advance_to(self.clock.t + dev.charge())
        return (grads, comm)

    @property
    def clock(self) -> RankClock:
        """This rank's virtual clock."""
        return self.ep.clock

    def info(self) -> dict[str, Any]:
        """Rank, process id, data-plane address and Ray node."""
        import ray

        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        return {"rank": self.rank, "pid": os.getpid(), "address": list(self.dataplane.address), "node": node}

    def pid(self) -> int:
        """This process's id (a spare has no rank yet)."""
        return os.getpid()

    def open_group(
        self, epoch: int, addresses: dict[int, list[Any]], t0: float, dp_active: list[int] | None = None
    ) -> dict[str, Any]:
        """Start group epoch ``epoch`` at virtual ``t0``: the world group and one per parallel axis
        (with ``dp_active``, of the ranks of those data-parallel indices only).

        Links are set up lazily on first use; with ``warmup`` (the default, as
        Huawei advises) a barrier in each gradient-sync group sets up the links
        of the algorithm it uses now, so their cost and any
        :class:`LinkSetupTimeout` show up here.
        """
        addr = {int(r): tuple(a) for r, a in addresses.items()}
        self.ep.new_epoch(epoch, addr)
        self.clock.advance_to(t0)
        active = None if dp_active is None else frozenset(dp_active)
        self.groups = open_groups(self.ep, self.spec.parallel(), active)
        self.comm = self.groups["world"]
        self.sync_algo = {}
        for name, nbytes in sorted(self.workload.sync_plan().items()):
            group = self.groups[name]
            algo = self.spec.algorithm
            if algo == "auto":
                algo = choose("allreduce", group.ranks, self.spec.topology, nbytes)
            self.sync_algo[name] = algo
            if self.spec.warmup and group.size > 1:
                try:
                    group.warmup(algo)
                except TestbedError as err:
                    err.fields["fault_hits"] = self.ep.take_hits()
                    raise
        return {"t": self.clock.t, "setup_s": self.clock.t - t0, "fault_hits": self.ep.take_hits()}

    def set_knob(self, name: str, value: Any) -> None:
        """Set one of this rank's fault knobs (:mod:`testbed.train.knobs`)."""
        self.knobs.set(name, value)

    def fragment(self, fault_id: str, block: int, count: int, spacing: int) -> dict[str, Any]:
        """Pin ``count`` blocks of ``block`` bytes with ``spacing``-byte holes between them (a fault)."""
        pinned: list[tuple[str, int]] = []
        gaps: list[tuple[str, int]] = []
        stopped: dict[str, str] = {}
        try:
            for _ in range(count):
                pinned.append(self.device.alloc(block, fault_id))
                gaps.append(self.device.alloc(spacing, f"{fault_id}-gap"))
        except DeviceOOM as err:  # the device filled up: pin what fitted
            stopped = {"stopped": err.message}
        for gap in gaps:
            self.device.free(gap)
        self._pins[fault_id] = pinned
        self.clock.advance_to(self.clock.t + self.device.charge())
        return {"pinned": len(pinned), **stopped, **self.device.stats()}

    def release(self, fault_id: str) -> None:
        """Free what :meth:`fragment` pinned (nothing if a restart already dropped it)."""
        for placed in self._pins.pop(fault_id, []):
            self.device.free(placed)

    def mark_dead(self, rank: int) -> None:
        """``rank``'s process died: stop waiting for it (called while a step is in flight)."""
        self.dataplane.mark_dead(rank)

    def set_link_faults(self, table: LinkFaultTable) -> None:
        """Replace the link faults in force."""
        self.ep.faults = table

    def _group(self) -> Communicator:
        if self.comm is None:
            raise TestbedError(f"rank {self.rank}: no group open; call open_group first", rank=self.rank)
        return self.comm

    def arm_kill(self, step: int, point: str, action: str = "kill") -> None:
        """When ``point`` of ``step`` is reached, have this supernode's supervisor SIGKILL this process
        (``kill``) or freeze it with SIGSTOP (``hang``)."""
        self._kill_at = (step, point)
        self._action = action

    def _hook(self, point: str) -> None:
        if self._kill_at != (self.ep.step, point):
            return
        self._kill_at = None
        self.dataplane.flush()  # what the model says was sent is on the wire before death
        import ray

        if self._action == "hang":
            self._leave_no_answer()
            ray.get(
                self.supervisor.freeze.remote(self.rank, self.clock.t, self.ep.step, point),
                timeout=self.spec.guard_s,
            )
        else:
            ray.get(
                self.supervisor.kill.remote(self.rank, self.clock.t, self.ep.step, point),
                timeout=self.spec.guard_s,
            )
        time.sleep(self.spec.guard_s)
        raise HarnessHang(f"rank {self.rank}: still running after its supervisor's signal", rank=self.rank)

    def _leave_no_answer(self) -> None:
        """Before freezing: a marker to every peer, so that a wait on this rank ends at its modelled
        exec timeout (``wait_start + exec_s``, a true timeout) instead of in wall time, as a dropped
        message's marker does. A frozen process sends nothing else."""
        why = f"rank {self.rank} stopped answering (hung since virtual t={self.clock.t:.6f} s)"
        peers = sorted({r for g in self.groups.values() for r in g.ranks} - {self.rank})
        for peer in peers:
            self.dataplane.send(peer, DROP, {"tag": self.ep.job_tag, "t": self.clock.t, "why": why})
        self.dataplane.flush()

    def _context(self, step: int) -> StepContext:
        preset = self.spec.topology.preset
        return StepContext(
            rank=self.rank,
            step=step,
            layout=self.spec.parallel(),
            groups=self.groups,
            clock=self.clock,
            peak_flops=preset.peak_flops,
            efficiency=preset.efficiency,
            sync_algo=self.sync_algo,
            missing_ops=self.knobs.missing_ops,
            scale=self.spec.compute_scale,
            slowdown=self.knobs.slowdown,
            hook=self._hook,
        )

    def _abort(self, err: TestbedError, phase: str) -> TestbedError:
        """Leave the step with ``err``: every rank that may wait on this one hears of it."""
        err.fields["phase"] = phase
        err.fields["fault_hits"] = self.ep.take_hits()
        peers = sorted({r for g in self.groups.values() for r in g.ranks})
        return abort_job(self.ep, peers, err)

    def train_step(self, step: int, not_before: float = 0.0) -> dict[str, Any]:
        """One training step: forward and backward (with TP/PP/EP traffic), gradient sync, update."""
        self._group()
        self.ep.step = step
        self.ep.attempt += 1
        self.ep.algorithms_run.clear()
        self.ep.link_obs.clear()
        self.clock.advance_to(not_before)
        self._hook("step.start")
        t0, compute0, wait0 = self.clock.t, self.clock.compute_s, self.clock.comm_wait_s
        bubble0 = self.ep.wait_by_op.get("recv", 0.0)
        self.clock.advance_to(self.clock.t + self.knobs.data_delay_s)  # the input pipeline is behind
        if self.spec.step_snapshot:
            self._take_snapshot(step)
        ctx = self._context(step)
        try:
            buffers = self._placed = self._place(step)
            self._hook("forward")
            loss, grads, samples = self.workload.forward_backward(ctx)
        except TestbedError as err:
            raise self._abort(err, "forward_backward") from None
        waits0 = tuple(self.ep.wait_by_op.items())
        self._pending = _PendingStep(
            step, loss, samples, t0, compute0, wait0, bubble0, ctx, grads, buffers, waits0
        )
        return self._reduce_and_apply()

    def _take_snapshot(self, step: int) -> None:
        """Copy the state this step starts from to host memory, charged ``bytes / hbm_bandwidth``."""
        state = {c: self.workload.state(c) for c in self.workload.components}
        nbytes = sum(a.nbytes for arrays in state.values() for a in arrays.values())
        self.clock.advance_to(
            self.clock.t + nbytes * self.spec.state_scale / self.spec.topology.preset.hbm_Bps
        )
        self._snapshot = (step, state)

    def rerun_step(self, step: int, not_before: float) -> dict[str, Any]:
        """Step retry: back to the state the failed step started from (kept in memory), run it again."""
        if self._snapshot is None or self._snapshot[0] != step:
            raise TestbedError(
                f"rank {self.rank}: no snapshot of step {step} to run it again", rank=self.rank
            )
        for component, arrays in self._snapshot[1].items():
            self.workload.load(component, arrays)
        for placed in self._placed:  # the failed attempt's device buffers
            self.device.free(placed)
        self._placed, self._pending = (), None
        return self.train_step(step, not_before)

    def retry_step(self, step: int, not_before: float) -> dict[str, Any]:
        """Op retry: run the failed step's gradient sync again (the forward and backward are kept)."""
        if self._pending is None or self._pending.step != step:
            raise TestbedError(
                f"rank {self.rank}: no failed gradient sync of step {step} to retry", rank=self.rank
            )
        self.ep.attempt += 1
        self.clock.advance_to(not_before)
        return self._reduce_and_apply()

    def _reduce_and_apply(self) -> dict[str, Any]:
        p = self._pending
        assert p is not None
        try:
            synced = self.workload.sync_grads(p.ctx, p.grads)
            lr = self.workload.apply(p.ctx, synced)
        except TestbedError as err:
            raise self._abort(err, "grad_sync") from None
        self._pending = None
        for placed in p.buffers:
            self.device.free(placed)
        self._placed = ()
        events, self.device.events = self.device.events, []
        bubble = self.ep.wait_by_op.get("recv", 0.0) - p.bubble0
        return {
            "memory": self.device.stats(),
            "memory_events": events,
            "rank": self.rank,
            "step": p.step,
            "loss": p.loss,
            "lr": lr,
            "samples": p.samples,
            "t_start": p.t0,
            "t": self.clock.t,
            "flops": p.ctx.flops,
            "compute_s": self.clock.compute_s - p.compute0,
            "comm_wait_s": self.clock.comm_wait_s - p.wait0 - bubble,
            "bubble_s": bubble,
            "data_wait_s": self.knobs.data_delay_s,
            "digest": self.workload.params_digest(),
            "algorithms": list(self.ep.algorithms_run),
            "links": {str(src): obs for src, obs in sorted(self.ep.link_obs.items())},
            "wait_by_op": self._waits_since(dict(p.waits0)),
            "fault_hits": self.ep.take_hits(),
        }

    def _waits_since(self, before: dict[str, float]) -> dict[str, float]:
        """Virtual seconds this rank waited in each kind of collective since ``before`` was taken."""
        now = self.ep.wait_by_op
        return {op: now[op] - before.get(op, 0.0) for op in sorted(now) if now[op] > before.get(op, 0.0)}

    def save_shard(self, tmp_dir: str, include: list[str]) -> dict[str, Any]:
        """Barrier, then write this rank's included components into the checkpoint's temp dir."""
        world = self._group()
        # the links of the world group's warmed-up algorithm (if it has one) are already set up
        warmed = [self.sync_algo[n] for n in self.sync_algo if self.groups[n] is world]
        world.barrier(warmed[0] if warmed else "auto")
        comps = {c: self.workload.state(c) for c in include if c in self.workload.components}
        if self.knobs.storage_full:
            raise CheckpointError(
                f"rank {self.rank}: writing its checkpoint shard failed: [Errno 28] No space left on device",
                rank=self.rank,
                errno=28,
            )
        entries = write_shard(Path(tmp_dir), self.rank, comps, hook=self._hook)
        return {
            "rank": self.rank,
            "entries": entries,
            "t": self.clock.t,
            "audit": audit(comps),
            "fault_hits": self.ep.take_hits(),
        }

    def reset(self, t0: float) -> None:
        """Become a freshly started process: initial workload state, clock at ``t0``."""
        self.workload = _make_workload(self.spec, self.rank)
        self.device = self._new_device()
        self._pins = {}
        self.ep.clock = RankClock()
        self.clock.reset(t0)
        self.comm = None  # the groups belong to the old process; open_group makes new ones
        self.groups = {}
        self._pending = None
        self._kill_at = None

    def restore(self, files: dict[str, list[str]]) -> int:
        """Load checkpoint components (``component -> [file, sha256]``); returns bytes read."""
        nbytes = 0
        for comp, (file, sha) in sorted(files.items()):
            arrays = read_component(file, sha)
            self.workload.load(comp, arrays)
            nbytes += sum(a.nbytes for a in arrays.values())
        return nbytes

    # --- in-memory replicas (testbed.train.replica_store) ----------------------------------
    def replica_snapshot(self, step: int) -> dict[str, Any]:
        """Copy this rank's whole state to host memory (charged ``bytes / hbm_bandwidth``), keep it,
        and return it for the holder; the caller sends it on."""
        state: State = {c: self.workload.state(c) for c in self.workload.components}
        state = {c: {k: np.array(a, copy=True) for k, a in arrays.items()} for c, arrays in state.items()}
        nbytes = state_bytes(state)
        self.clock.advance_to(
            self.clock.t + nbytes * self.spec.state_scale / self.spec.topology.preset.hbm_Bps
        )
        self.replicas.keep_own(step, state)
        return {"rank": self.rank, "state": state, "bytes": nbytes, "t": self.clock.t}

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

    def close(self) -> None:
        """Close the data plane."""
        self.dataplane.close()
