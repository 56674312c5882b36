"""The collectives a rank calls: one method per collective, the algorithm by name or ``auto``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from testbed.collectives import alltoall, doubling, halving_doubling, hierarchical, mesh, ring
from testbed.collectives.closed_form import split_s
from testbed.collectives.group import Group
from testbed.collectives.modelled import Modelled, scales
from testbed.collectives.ops import check, finish
from testbed.collectives.select import OFFERED, choose, links_at_once
from testbed.core.errors import TestbedError

_ALLREDUCE: dict[str, Callable[..., np.ndarray]] = {
    "ring": ring.allreduce,
    "mesh": mesh.allreduce,
    "halving_doubling": halving_doubling.allreduce,
    "hierarchical": hierarchical.allreduce,
    "recursive_doubling": doubling.allreduce,
}
_TABLE: dict[str, dict[str, Callable[..., Any]]] = {
    "allreduce": _ALLREDUCE,
    "barrier": _ALLREDUCE,
    "reduce_scatter": {
        "ring": ring.reduce_scatter,
        "mesh": mesh.reduce_scatter,
        "halving_doubling": halving_doubling.reduce_scatter,
    },
    "allgather": {
        "ring": ring.allgather,
        "mesh": mesh.allgather,
        "halving_doubling": halving_doubling.allgather,
    },
    "broadcast": {
        "ring": ring.broadcast,
        "mesh": mesh.broadcast,
        "halving_doubling": halving_doubling.broadcast,
    },
    "reduce": {"ring": ring.reduce, "mesh": mesh.reduce},
    "alltoall": {"pairwise": alltoall.pairwise, "mesh": alltoall.mesh},
}


class Communicator(Group):
    """A group with every collective. Each call names its algorithm or lets ``auto`` choose."""

    def __init__(self, ep: Any, name: str, ranks: list[int]) -> None:
        super().__init__(ep, name, ranks)
        self._auto: dict[tuple[str, int], str] = {}  # what auto chose, by collective and size

    def _start(
        self, collective: str, algo: str, nbytes: int, modelled: Modelled | None = None, setup_group: int = 0
    ) -> Callable[..., Any]:
        """Begin ``collective`` of ``nbytes``; with ``modelled`` it is chosen at one of the job's calls
        and timed as all the calls it stands for; its links are set up with the load of ``setup_group``
        ranks (or the modelled job's group) setting theirs up, if more than its own."""
        size = nbytes if modelled is None else modelled.per_call
        if algo == "auto":
            key = (collective, size)
            chosen = self._auto.get(key)
            if chosen is None:
                chosen = self._auto[key] = choose(collective, self.ranks, self.ep.topology, size)
            algo = chosen
        if algo not in OFFERED[collective]:
            raise TestbedError(
                f"{collective} has no algorithm '{algo}'; use auto or one of "
                f"{', '.join(OFFERED[collective])}",
                algo=algo,
            )
        byte_scale = call_scale = 1.0
        if modelled is not None and self.size > 1:
            _, latency, transfer = split_s(collective, self.ranks, self.ep.topology, nbytes, algo)
            byte_scale, call_scale = scales(modelled, latency, transfer)
        setup_n = max(self.size, round(self.size * self.ep.setup_scale)) if self.size > 1 else 1
        setup_group = modelled.group if modelled is not None and modelled.group else setup_group
        if self.size > 1 and setup_group > setup_n:
            setup_n = setup_group
        self.begin(collective, algo, links_at_once(algo, setup_n), byte_scale, call_scale)
        modelled_bytes = nbytes if byte_scale == 1.0 else nbytes * byte_scale
        self.op_record = self.ep.record_op(collective, algo, self.name, modelled_bytes, self.ep.clock.t)
        run = _TABLE[collective][algo]

        def run_then_flush(*args: Any) -> Any:
            try:
                out = run(*args)
            finally:
                self.ended()
            self.ep.dataplane.flush()  # sends are zero-copy: let the caller own its arrays again
            return out

        return run_then_flush

    def allreduce(
        self,
        buf: np.ndarray,
        op: str = "sum",
        algo: str = "auto",
        bf16: bool = False,
        modelled: Modelled | None = None,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """Every rank gets ``op`` over all ranks' ``buf`` (the same bits everywhere); ``modelled``:
        the job's calls it stands for, to choose and time it by (:class:`Modelled`). With ``out`` (of
        ``buf``'s shape and type, contiguous), the result is written there and returned: ``out=buf``
        reduces in place, as ``torch.distributed`` and HCCL do, without a new array per call."""
        check(buf, op, bf16, out)
        run = self._start("allreduce", algo, buf.nbytes, modelled)
        if self.size == 1:
            result: np.ndarray = buf.copy()
        elif self.algo == "ring":  # writes into ``out`` itself; the others make their own array
            result = run(self, buf, op, bf16, out)
        else:
            result = run(self, buf, op, bf16)
        result = finish(result, op, self.size, bf16)
        if out is not None and result is not out:
            out[...] = result
            return out
        return result

    def reduce_scatter(
        self,
        buf: np.ndarray,
        op: str = "sum",
        algo: str = "auto",
        bf16: bool = False,
        modelled: Modelled | None = None,
    ) -> np.ndarray:
        """This rank's part (``np.array_split`` order over the flattened buffer) of the reduction."""
        check(buf, op, bf16)
        run = self._start("reduce_scatter", algo, buf.nbytes, modelled)
        out: np.ndarray = run(self, buf, op, bf16) if self.size > 1 else buf.ravel().copy()
        return finish(out, op, self.size, bf16)

    def allgather(
        self, piece: np.ndarray, algo: str = "auto", modelled: Modelled | None = None
    ) -> np.ndarray:
        """Every rank's equal-length ``piece``, concatenated in group order (``modelled``: in gathered
        bytes)."""
        run = self._start("allgather", algo, piece.nbytes * self.size, modelled)
        out: np.ndarray = run(self, piece) if self.size > 1 else piece.ravel().copy()
        return out

    def broadcast(self, buf: np.ndarray, root: int, algo: str = "auto") -> np.ndarray:
        """``root``'s buffer on every rank (``root`` is a global rank)."""
        self._member(root)
        run = self._start("broadcast", algo, buf.nbytes)
        out: np.ndarray = run(self, buf, root) if self.size > 1 else buf.copy()
        return out

    def reduce(
        self, buf: np.ndarray, root: int, op: str = "sum", algo: str = "auto", bf16: bool = False
    ) -> np.ndarray | None:
        """The reduction on ``root``; None elsewhere."""
        check(buf, op, bf16)
        self._member(root)
        run = self._start("reduce", algo, buf.nbytes)
        out: np.ndarray | None = run(self, buf, root, op, bf16) if self.size > 1 else buf.copy()
        return None if out is None else finish(out, op, self.size, bf16)

    def alltoall(
        self, blocks: list[np.ndarray], algo: str = "auto", modelled: Modelled | None = None
    ) -> list[np.ndarray]:
        """Block ``j`` of every rank goes to the ``j``-th member; returns what each member sent here
        (``modelled``: in the blocks' bytes summed)."""
        if len(blocks) != self.size:
            raise TestbedError(f"alltoall needs {self.size} blocks (one per member), got {len(blocks)}")
        run = self._start("alltoall", algo, sum(b.nbytes for b in blocks), modelled)
        out: list[np.ndarray] = run(self, blocks) if self.size > 1 else [blocks[0].copy()]
        return out

    def barrier(self, algo: str = "auto") -> None:
        """Return once every member has arrived (an allreduce of one float64)."""
        run = self._start("barrier", algo, 8)
        if self.size > 1:
            run(self, np.zeros(1), "sum", False)

    def fail_next(self, collective: str, algo: str, err: TestbedError) -> TestbedError:
        """This rank cannot take part in its next collective: abort it for the others; returns ``err``."""
        self._start(collective, algo, 0)
        return self.origin(err)

    def warmup(self, algo: str = "auto", as_group: int = 0) -> None:
        """Set up the links of ``algo`` now (as Huawei advises before the first real step); with
        ``as_group``, with the load of that many ranks setting theirs up (a modelled job's group)."""
        run = self._start("barrier", algo, 8, setup_group=as_group)
        if self.size > 1:
            run(self, np.zeros(1), "sum", False)

    def _member(self, root: int) -> None:
        if root not in self.ranks:
            raise TestbedError(f"root {root} is not a member of group '{self.name}' {self.ranks}", root=root)
