"""Collectives over the data plane, with real numpy data and virtual time.

Algorithms and their contention-free virtual durations (``a`` link latency,
``B`` bandwidth, ``S`` bytes, ``n`` ranks), from the standard cost model of
Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication
Operations in MPICH" (IJHPCA 2005):

- ring allreduce: ``2(n-1)·a + 2(n-1)/n · S/B`` (reduce-scatter then allgather)
- chain broadcast from the root along the ring: ``(n-1)·(a + S/B)``
- barrier: a ring allreduce of one float64.

A peer that dies surfaces as :class:`PeerLost`: the rank after it sees its
socket close, and every survivor forwards an abort frame to its successor
before raising, so the whole group unblocks in order, deterministically: a
rank reads every data frame its predecessor sent before the abort.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from testbed.clock import RankClock
from testbed.dataplane import ABORT, DataPlane, PeerClosed
from testbed.errors import CollectiveTimeout, PeerLost, TestbedError
from testbed.topology import Topology

Hook = Callable[[str], None]


@dataclass
class Communicator:
    """One rank's view of a group: ring order, links, clock and the execution timeout."""

    rank: int
    ranks: list[int]
    dataplane: DataPlane
    clock: RankClock
    topology: Topology
    exec_timeout_s: float
    hook: Hook | None = None
    step: int = 0
    wait_by_collective: dict[str, float] = field(default_factory=dict)
    _seq: int = 0

    @property
    def size(self) -> int:
        """Number of ranks in the group."""
        return len(self.ranks)

    @property
    def index(self) -> int:
        """This rank's position in the group's ring."""
        return self.ranks.index(self.rank)

    @property
    def next(self) -> int:
        """The ring successor (global rank)."""
        return self.ranks[(self.index + 1) % self.size]

    @property
    def prev(self) -> int:
        """The ring predecessor (global rank)."""
        return self.ranks[(self.index - 1) % self.size]

    def send(self, dst: int, arr: np.ndarray, op: str) -> None:
        """Send ``arr`` to ``dst``, charging the sender's egress."""
        data = np.ascontiguousarray(arr)
        arrival = self.clock.send(data.nbytes, self.topology.link(self.rank, dst))
        header = {
            "op": op,
            "seq": self._seq,
            "arrival": arrival,
            "dtype": data.dtype.str,
            "shape": data.shape,
        }
        self.dataplane.send(dst, 0, header, data.tobytes())

    def recv(self, src: int, op: str) -> np.ndarray:
        """Receive the next array from ``src``; advances the clock to its arrival."""
        wait_start = self.clock.t
        try:
            kind, header, payload = self.dataplane.recv(src)
        except PeerClosed:
            self.abort(dead=src)
            raise self._lost(peer=src, wait_start=wait_start, how="eof", op=op) from None
        if kind == ABORT:
            self.abort(dead=int(header["dead"]))
            raise self._lost(peer=int(header["dead"]), wait_start=wait_start, how="abort", op=op)
        if header["op"] != op or header["seq"] != self._seq:
            raise TestbedError(
                f"rank {self.rank}: expected {op}#{self._seq} from rank {src}, got "
                f"{header['op']}#{header['seq']}; the ranks disagree on the collective order",
                rank=self.rank,
            )
        arrival = float(header["arrival"])
        if arrival - wait_start > self.exec_timeout_s:
            self.clock.advance_to(wait_start + self.exec_timeout_s)
            self.abort(dead=-1)
            raise CollectiveTimeout(
                f"rank {self.rank}: {op} at step {self.step} waited on rank {src} past the exec "
                f"timeout of {self.exec_timeout_s:g} s (message arrives {arrival - wait_start:.3f} s "
                "after the wait began; the peer is alive, so this timeout is false)",
                rank=self.rank,
                peer=src,
                op=op,
                step=self.step,
                true_timeout=False,
                t=self.clock.t,
            )
        self.clock.receive(arrival)
        self.wait_by_collective[op] = self.wait_by_collective.get(op, 0.0) + arrival - wait_start
        dtype = np.dtype(header["dtype"])
        out: np.ndarray = np.frombuffer(payload, dtype=dtype).reshape(header["shape"])
        return out

    def abort(self, dead: int) -> None:
        """Tell the successor that the group is broken (``dead``: who died, -1 if unknown)."""
        self.dataplane.broadcast_abort({"dead": dead, "from": self.rank})

    def _lost(self, peer: int, wait_start: float, how: str, op: str) -> PeerLost:
        return PeerLost(
            f"rank {self.rank}: peer rank {peer} lost during {op} at step {self.step} ({how}); "
            f"the wait began at virtual t={wait_start:.6f} s",
            rank=self.rank,
            peer=peer,
            wait_start=wait_start,
            how=how,
            op=op,
            step=self.step,
        )

    def _fire(self, point: str) -> None:
        if self.hook is not None:
            self.hook(point)

    def allreduce(self, buf: np.ndarray) -> np.ndarray:
        """Ring allreduce (sum) of ``buf``; returns the reduced array, the same bits on every rank.

        Virtual time, contention free: ``2(n-1)·a + 2(n-1)/n · S/B``.
        """
        n, r = self.size, self.index
        self._seq += 1
        if n == 1:
            single: np.ndarray = buf.copy()
            return single
        chunks = [c.copy() for c in np.array_split(buf.ravel(), n)]
        for s in range(n - 1):  # reduce-scatter
            self.send(self.next, chunks[(r - s) % n], "allreduce")
            i = (r - s - 1) % n
            chunks[i] = chunks[i] + self.recv(self.prev, "allreduce")
        self._fire("allreduce.mid")
        for s in range(n - 1):  # allgather
            self.send(self.next, chunks[(r - s + 1) % n], "allreduce")
            chunks[(r - s) % n] = self.recv(self.prev, "allreduce").copy()
        result: np.ndarray = np.concatenate(chunks).reshape(buf.shape)
        return result

    def broadcast(self, buf: np.ndarray, root: int) -> np.ndarray:
        """Chain broadcast from global rank ``root`` along the ring: ``(n-1)·(a + S/B)``."""
        self._seq += 1
        out: np.ndarray = buf.copy()
        if self.rank != root:
            out = self.recv(self.prev, "broadcast").copy()
        if self.next != root:
            self.send(self.next, out, "broadcast")
        return out

    def barrier(self) -> None:
        """Block until every rank of the group arrives: a ring allreduce of one float64."""
        self.allreduce(np.zeros(1, dtype=np.float64))
