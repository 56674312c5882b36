"""One NPU: the training program of one rank, run inside its own OS process.

The class is plain Python (testable without Ray); :mod:`testbed.actors.npu_host`
runs it in a process its supernode supervises. It owns the rank's data plane, virtual clock and
workload state, and carries out what the controller asks: open the group,
train a step, write or restore a checkpoint shard, die at an armed point.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from testbed.collectives import Communicator, Endpoint, abort_job, choose
from testbed.core.errors import DeviceOOM, TestbedError
from testbed.fabric.clock import RankClock
from testbed.fabric.dataplane import DataPlane
from testbed.fabric.device_memory import Device
from testbed.job.pipeline import PipelineWaits
from testbed.train.corruption import gradient_norm
from testbed.train.knobs import Knobs
from testbed.train.rank_corruption import AT_REST, RankCorruption
from testbed.train.rank_faults import RankFaults
from testbed.train.rank_preemption import Notice, RankPreemption, terms_received
from testbed.train.rank_spec import RankSpec
from testbed.train.rank_state import RankState
from testbed.train.rank_zombie import RankZombie
from testbed.train.replica_store import ReplicaStore
from testbed.train.step_context import StepContext, open_groups


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


class NPU(RankFaults, RankPreemption, RankState, RankZombie):
    """The rank's program; every public method is one control-plane call.

    What faults do to the rank is in :class:`RankFaults`; saving, restoring and
    copying its state in :class:`RankState`.
    """

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
        self.dataplane = DataPlane(
            rank, spec.secret, spec.host, spec.guard_s, spec.socket_dir, world=spec.topology.world
        )
        self.dataplane.relay = getattr(self.supervisor, "relay", None)  # markers through the supernode
        if hasattr(self.supervisor, "refused"):  # a refused peer is told to the supernode, kept there
            self.dataplane.on_refused = self.supervisor.refused
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
        # only now: the supernode's line thread hands a rank >= 0 the markers of the death that made
        # this spare adopt it, and a spare that took the rank first met them without a data plane
        # (its line thread died on the AttributeError, and no call reached it again)
        self.rank = rank
        self.workload = spec.make_workload(rank)
        self.device = self._new_device()
        self._pins: dict[str, list[tuple[str, int]]] = {}
        self.comm: Communicator | None = None
        self.groups: dict[str, Communicator] = {}
        self.sync_algo: dict[str, str] = {}
        #: the modelled job's scales per group (RankState.job_scale), derived once per group epoch
        self.job_scales_now: dict[str, tuple[float, float, int, int]] = {}
        self.pipeline_now: PipelineWaits | None = None  # the job's pipeline waits (RankState.pipeline_waits)
        self.knobs = Knobs()
        self._snapshot: tuple[int, dict[str, dict[str, np.ndarray]]] | None = None
        self._placed: tuple[tuple[str, int], ...] = ()
        self._pending: _PendingStep | None = None
        self._kill_at: tuple[int, str] | None = None
        self._action = "kill"
        self.notice = Notice(terms_received())
        self.sdc = RankCorruption(self.rank, lambda: self.ep.clock, self.spec.topology.preset.hbm_Bps)
        self._grad_seen = (0.0, 0)  # the local gradients' norm and bytes, as an integrity check sees them
        self.link_anchors, self._anchors_new, self._anchor_points = {}, {}, set()

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
        """Rank, process id and data-plane address (its supernode adds the Ray node)."""
        return {"rank": self.rank, "pid": os.getpid(), "address": list(self.dataplane.address)}

    def pid(self) -> int:
        """This process's id (a spare has no rank yet)."""
        return os.getpid()

    def open_group(
        self,
        epoch: int,
        addresses: dict[int, list[Any]],
        t0: float,
        dp_active: list[int] | None = None,
        fresh: bool = False,
    ) -> dict[str, Any]:
        """Start group epoch ``epoch`` at virtual ``t0``: the world group and one per parallel axis
        (with ``dp_active``, of the ranks of those data-parallel indices only).

        Links are set up lazily on first use; with ``warmup`` (the default, as
        Huawei advises) a barrier in each gradient-sync group sets up the links
        of the algorithm it uses now, so their cost and any
        :class:`LinkSetupTimeout` show up here. ``fresh``: the first epoch of a fresh job (after
        :meth:`fresh_job`), whose links are set up as a new job's first epoch's are.
        """
        addr = {int(r): tuple(a) for r, a in addresses.items()}
        self.ep.new_epoch(epoch, addr)
        if fresh:
            self.ep.first_epoch = epoch
        self.clock.advance_to(t0)
        active = None if dp_active is None else frozenset(dp_active)
        self.groups = open_groups(self.ep, self.spec.parallel(), active)
        self.comm = self.groups["world"]
        self.sync_algo = {}
        job = self.job_scales_now = self.job_scale()  # its call's size picks, its group's load sets up
        self.pipeline_now = self.pipeline_waits()
        for name, nbytes in sorted(self.workload.sync_plan().items()):
            group = self.groups[name]
            algo = self.spec.algorithm
            if algo == "auto":
                size = job[name][2] if name in job else nbytes
                algo = choose("allreduce", group.ranks, self.spec.topology, size)
            self.sync_algo[name] = algo
            if self.spec.warmup and group.size > 1:
                try:
                    group.warmup(algo, job[name][3] if name in job else 0)
                except TestbedError as err:
                    err.fields["fault_hits"] = self.ep.take_hits()
                    raise
        return {
            "t": self.clock.t,
            "setup_s": self.clock.t - t0,
            "link_setup_max_s": self.ep.longest_setup_s,
            "fault_hits": self.ep.take_hits(),
        }

    def _context(self, step: int) -> StepContext:
        preset = self.spec.topology.preset
        return StepContext(
            rank=self.rank,
            step=step,
            layout=self.spec.parallel(),
            groups=self.groups,
            clock=self.clock,
            peak_flops=preset.peak_flops,
            efficiency=preset.efficiency if self.spec.job is None else self.spec.job.efficiency,
            sync_algo=self.sync_algo,
            missing_ops=self.knobs.missing_ops,
            scale=self.compute_scale(),
            job_scale=self.job_scales_now,
            pipeline=self.pipeline_now,
            slowdown=self.knobs.slowdown,
            hook=self._hook,
        )

    def _abort(self, err: TestbedError, phase: str) -> TestbedError:
        """Leave the step with ``err``: every rank that may wait on this one hears of it."""
        err.fields["phase"] = phase
        err.fields["fault_hits"] = self.ep.take_hits()
        err.fields["fault_anchors"] = self.take_anchors()
        peers = sorted({r for g in self.groups.values() for r in g.ranks})
        return abort_job(self.ep, peers, err)

    def train_step(self, step: int, not_before: float = 0.0) -> dict[str, Any]:
        """One training step: forward and backward (with TP/PP/EP traffic), gradient sync, update."""
        self._group()
        self.ep.step = step
        self.ep.attempt += 1
        self.ep.algorithms_run.clear()
        self.ep.ops_run.clear()
        self.ep.ops_seen = 0
        self.ep.link_obs.clear()
        self.clock.advance_to(not_before)
        self._hook("step.start")
        t0, compute0, wait0 = self.clock.t, self.clock.compute_s, self.clock.comm_wait_s
        bubble0 = self.ep.wait_by_op.get("recv", 0.0)
        self.clock.advance_to(self.clock.t + self.knobs.data_delay_s)  # the input pipeline is behind
        if self.spec.step_snapshot:
            self._take_snapshot(step)
        ctx = self._context(step)
        sdc = self.sdc.begin(self.knobs.sdc, step, self.ep.attempt, self.spec.payload_checksums)
        self.ep.on_payload = self.sdc.payload if self.sdc.watches_payloads else None
        ctx.made = self.sdc.made if self.sdc.made_spec is not None else None
        try:
            self.ep.job_abort_follows = True
            buffers = self._placed = self._place(step)
            self._hook("forward")
            if sdc is not None and sdc.where in AT_REST:
                self.sdc.strike_state(sdc, self.workload)
            try:
                loss, grads, samples = self.workload.forward_backward(ctx)
                ctx.pipeline_done()
            except IndexError as err:
                raise self.sdc.device_fault(err) from None
            if sdc is not None and sdc.where == "gradient":
                grads = self.sdc.strike_gradients(sdc, grads)
            self._grad_seen = gradient_norm(grads), sum(int(g.nbytes) for g in grads.values())
        except TestbedError as err:
            raise self._abort(err, "forward_backward") from None
        finally:
            self.ep.job_abort_follows = False
        waits0 = tuple(self.ep.wait_by_op.items())
        self._pending = _PendingStep(
            step, loss, samples, t0, compute0, wait0, bubble0, ctx, grads, buffers, waits0
        )
        return self._reduce_and_apply()

    def train_steps(self, first: int, count: int, not_before: float = 0.0) -> dict[str, Any]:
        """``count`` steps from ``first`` in one call (nothing is due between them), their results in
        ``steps``; a step that fails raises, its error carrying the results done before it (``done``)."""
        done: list[dict[str, Any]] = []
        for step in range(first, first + count):
            try:
                done.append(self.train_step(step, not_before if step == first else 0.0))
            except TestbedError as err:
                err.fields["done"] = done
                raise
        return {"steps": done}

    def _take_snapshot(self, step: int) -> None:
        """Copy the state this step starts from to host memory, charged ``bytes / hbm_bandwidth``."""
        state = {c: self.workload.state(c) for c in self.workload.components}
        nbytes = sum(a.nbytes for arrays in state.values() for a in arrays.values())
        self.clock.advance_to(self.clock.t + nbytes * self.state_scale() / self.spec.topology.preset.hbm_Bps)
        self._snapshot = (step, state)

    def rerun_step(self, step: int, not_before: float, healthy: bool = False) -> dict[str, Any]:
        """Step retry (and an integrity replay): back to the state the step started from (kept in
        memory), run it again; ``healthy``: as on another NPU, free of this one's silent corruption."""
        if self._snapshot is None or self._snapshot[0] != step:
            raise TestbedError(
                f"rank {self.rank}: no snapshot of step {step} to run it again", rank=self.rank
            )
        for component, arrays in self._snapshot[1].items():
            self.workload.load(component, arrays)
        for placed in self._placed:  # the failed attempt's device buffers
            self.device.free(placed)
        self._placed, self._pending = (), None
        self.sdc.healthy_run = healthy
        try:
            return self.train_step(step, not_before)
        finally:
            self.sdc.healthy_run = False

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
            self.ep.job_abort_follows = True
            self._hook("grad_sync")
            synced = self.workload.sync_grads(p.ctx, p.grads)
            lr = self.workload.apply(p.ctx, synced)
        except TestbedError as err:
            raise self._abort(err, "grad_sync") from None
        finally:
            self.ep.job_abort_follows = False
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
            "ops": self.ep.ops_of_step(p.t0),
            "links": {str(src): obs for src, obs in sorted(self.ep.link_obs.items())},
            "wait_by_op": self._waits_since(dict(p.waits0)),
            "fault_hits": self.ep.take_hits(),
            "fault_anchors": self.take_anchors(),
            "grad_norm": self._grad_seen[0],
            "grad_bytes": self._grad_seen[1],
            **self.sdc.step_fields(),
        }

    def _waits_since(self, before: dict[str, float]) -> dict[str, float]:
        """Virtual seconds this rank waited in each kind of collective since ``before`` was taken."""
        now = self.ep.wait_by_op
        return {op: now[op] - before.get(op, 0.0) for op in sorted(now) if now[op] > before.get(op, 0.0)}

    def skip_batches(self, n: int) -> None:
        """Throw away the next ``n`` batches of this rank's data (a rollback that skips suspect data)."""
        self.workload.skip_batches(n)

    def reset(self, t0: float) -> None:
        """Become a freshly started process: initial workload state, clock at ``t0``."""
        self.workload = self.spec.make_workload(self.rank)
        self.device = self._new_device()
        self._pins = {}
        self.ep.clock = RankClock()
        self.clock.reset(t0)
        self.comm = None  # the groups belong to the old process; open_group makes new ones
        self.groups = {}
        self._pending = None
        self._kill_at = None
        n = self.notice  # a notice armed for the restart's load reaches the process restarted here
        armed = n.armed if n.armed is not None and n.armed[1] == "load.mid" else None
        self.notice = Notice(terms_received(), armed, n.window_s, n.on_notice)
        self.link_anchors, self._anchors_new, self._anchor_points = {}, {}, set()

    def fresh_job(self, t0: float) -> None:
        """Become the first process of a fresh, healthy job (the reference run's, the probe's): a
        :meth:`reset` that also drops what a restarted process of the same job keeps, the fault knobs
        and the waits added up so far, so a yardstick's times depend on the scenario alone and not on
        what the main phase went through."""
        self.reset(t0)
        self.knobs = Knobs()
        self.ep.wait_by_op = {}
        self.ep.netem = {}
        self.ep.fault_hits = {}

    def close(self) -> None:
        """Close the data plane."""
        self.dataplane.close()
