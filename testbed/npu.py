"""One NPU: the training program of one rank, run inside its own Ray actor process.

The class is plain Python (testable without Ray); :mod:`testbed.cluster`
wraps it as an actor. It owns the rank's data plane, virtual clock and
workload state, and carries out what the controller asks: open the group,
train a step, write or restore a checkpoint shard, die at an armed point.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from testbed.checkpoint import read_component, write_shard
from testbed.clock import RankClock, link_setup_s
from testbed.collectives import Communicator
from testbed.dataplane import DataPlane
from testbed.errors import HarnessHang, LinkSetupTimeout, TestbedError
from testbed.topology import Topology

#: HCCL adds 20 s of grace to HCCL_CONNECT_TIMEOUT before failing link setup.
HCCL_CONNECT_GRACE_S = 20.0


@dataclass(frozen=True)
class RankSpec:
    """Everything an NPU needs to know at start, identical for every rank."""

    topology: Topology
    seed: int
    workload: str
    workload_options: dict[str, Any]
    connect_timeout_s: float
    exec_timeout_s: float
    guard_s: float = 60.0
    host: str = "127.0.0.1"


def _make_workload(spec: RankSpec, rank: int) -> Any:
    from workloads import WORKLOADS

    return WORKLOADS[spec.workload].factory(spec.workload_options, spec.seed, rank, spec.topology.world)


class NPU:
    """The rank's program; every public method is one control-plane call."""

    def __init__(self, rank: int, spec: RankSpec, supervisor: Any = None) -> None:
        self.rank = rank
        self.spec = spec
        self.supervisor = supervisor
        self.dataplane = DataPlane(rank, spec.host, spec.guard_s)
        self.clock = RankClock()
        self.workload = _make_workload(spec, rank)
        self.comm: Communicator | None = None
        self._kill_at: tuple[int, str] | None = None

    def info(self) -> dict[str, Any]:
        """Rank, process id and data-plane address."""
        return {"rank": self.rank, "pid": os.getpid(), "address": list(self.dataplane.address)}

    def open_group(self, epoch: int, addresses: dict[int, list[Any]], t0: float) -> dict[str, Any]:
        """Set up the ring links of the world group for ``epoch``, starting at virtual ``t0``.

        The real sockets are connected now; the virtual cost is the slowest
        link's setup time (the group is ready when every link is), or a
        :class:`LinkSetupTimeout` at ``t0 + connect_timeout + 20 s``.
        """
        ranks = sorted(int(r) for r in addresses)
        n = len(ranks)
        i = ranks.index(self.rank)
        nxt, prv = ranks[(i + 1) % n], ranks[(i - 1) % n]
        addr = {int(r): (str(a[0]), int(a[1])) for r, a in addresses.items()}
        self.dataplane.open_epoch(epoch, addr, [nxt] if n > 1 else [], [prv] if n > 1 else [])
        self.clock.advance_to(t0)
        links = [(ranks[j], ranks[(j + 1) % n]) for j in range(n)] if n > 1 else []
        setup = {
            pair: link_setup_s(self.spec.topology.preset.link_setup, self.spec.seed, epoch, *pair, len(links))
            for pair in links
        }
        worst = max(setup, key=lambda p: setup[p]) if setup else None
        worst_s = setup[worst] if worst else 0.0
        limit = self.spec.connect_timeout_s + HCCL_CONNECT_GRACE_S
        if worst is not None and worst_s > limit:
            self.clock.advance_to(t0 + limit)
            raise LinkSetupTimeout(
                f"link setup {worst[0]}->{worst[1]} needs {worst_s:.1f} s, past the connect timeout "
                f"{self.spec.connect_timeout_s:g} s + {HCCL_CONNECT_GRACE_S:g} s grace (HCCL EI0006); "
                "raise policy.timeouts.connect_s or warm the group up earlier",
                pair=list(worst),
                setup_s=worst_s,
                t=self.clock.t,
            )
        self.clock.advance_to(t0 + worst_s)
        self.comm = Communicator(
            rank=self.rank,
            ranks=ranks,
            dataplane=self.dataplane,
            clock=self.clock,
            topology=self.spec.topology,
            exec_timeout_s=self.spec.exec_timeout_s,
            hook=self._hook,
        )
        return {"t": self.clock.t, "setup_s": worst_s}

    def _group(self) -> Communicator:
        if self.comm is None:
            raise TestbedError(f"rank {self.rank}: no group open; call open_group first", rank=self.rank)
        return self.comm

    def arm_kill(self, step: int, point: str) -> None:
        """Die (by SIGKILL from this supernode's supervisor) when ``point`` of ``step`` is reached."""
        self._kill_at = (step, point)

    def _hook(self, point: str) -> None:
        comm = self._group()
        if self._kill_at != (comm.step, point):
            return
        self._kill_at = None
        self.dataplane.flush()  # what the model says was sent is on the wire before death
        import ray

        ray.get(
            self.supervisor.kill.remote(self.rank, self.clock.t, comm.step, point), timeout=self.spec.guard_s
        )
        time.sleep(self.spec.guard_s)
        raise HarnessHang(f"rank {self.rank}: still alive after its supervisor's SIGKILL", rank=self.rank)

    def train_step(self, step: int, not_before: float = 0.0) -> dict[str, Any]:
        """One training step: local forward/backward, gradient allreduce, optimizer update."""
        comm = self._group()
        comm.step = step
        self.clock.advance_to(not_before)
        t0, wait0 = self.clock.t, self.clock.comm_wait_s
        loss, grads, samples = self.workload.forward_backward()
        preset = self.spec.topology.preset
        compute_s = self.clock.compute(self.workload.flops_per_step(), preset.peak_flops, preset.efficiency)
        names = sorted(grads)
        flat = np.concatenate([grads[k].ravel() for k in names])
        total = comm.allreduce(flat)
        avg = total / np.float32(comm.size)
        out, offset = {}, 0
        for k in names:
            size = grads[k].size
            out[k] = avg[offset : offset + size].reshape(grads[k].shape)
            offset += size
        lr = self.workload.apply(out)
        return {
            "rank": self.rank,
            "step": step,
            "loss": loss,
            "lr": lr,
            "samples": samples,
            "t_start": t0,
            "t": self.clock.t,
            "compute_s": compute_s,
            "comm_wait_s": self.clock.comm_wait_s - wait0,
            "digest": self.workload.params_digest(),
        }

    def save_shard(self, tmp_dir: str, include: list[str]) -> dict[str, Any]:
        """Barrier, then write this rank's included components into the checkpoint's temp dir."""
        self._group().barrier()
        comps = {c: self.workload.state(c) for c in include if c in self.workload.components}
        entries = write_shard(Path(tmp_dir), self.rank, comps)
        return {"rank": self.rank, "entries": entries, "t": self.clock.t}

    def reset(self, t0: float) -> None:
        """Become a freshly started process: initial workload state, clock at ``t0``."""
        self.workload = _make_workload(self.spec, self.rank)
        self.clock = RankClock()
        self.clock.reset(t0)
        self.comm = None  # the group belongs to the old process; open_group makes a new one
        self._kill_at = None

    def restore(self, files: dict[str, list[str]]) -> int:
        """Load checkpoint components (``component -> [file, sha256]``); returns bytes read."""
        nbytes = 0
        for comp, (file, sha) in sorted(files.items()):
            arrays = read_component(file, sha)
            self.workload.load(comp, arrays)
            nbytes += sum(a.nbytes for a in arrays.values())
        return nbytes

    def digest(self) -> str:
        """sha256 of this rank's parameters."""
        return str(self.workload.params_digest())

    def close(self) -> None:
        """Close the data plane."""
        self.dataplane.close()
