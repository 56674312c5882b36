"""Serving on an NPU process: the calls a serving instance answers.

:class:`ServeRank` is mixed into the NPU program the NPU host runs
(:mod:`testbed.actors.npu_host`), so a serving instance lives in a real NPU
process beside the training program's state: its KV cache, its scheduler and
its proxy model are that process's memory, and a SIGKILL of the process
loses them. The controller opens the instance, then calls ``serve_advance``
with the requests routed to it since the last call.

An instance with ``ranks_per_instance`` above one spans that many NPU processes, its
group: each holds its share of the proxy's width (its KV cache shard and
its rows of the output projection) and, for a mixture-of-experts model, its
share of the experts; it runs the same scheduler on the same requests, and
every forward pass runs real collectives over the fabric: the experts'
allgather dispatch and alltoall combine, and the allreduce of the group's
partial logits. A SIGKILL of any one of them ends the
others' collective with :class:`~testbed.core.errors.PeerLost`: the instance
is lost, as an instance is when one of its NPUs dies.

A death armed at a virtual time strikes in the iteration that spans it,
once the iteration's length is known and before any of its tokens exists:
the process asks its supernode for a SIGKILL, as a training rank does at a
point of a step (:mod:`testbed.train.rank_faults`).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from testbed.collectives import Communicator, Endpoint
from testbed.core.errors import HarnessHang, TestbedError
from testbed.serve.colocation import Interference
from testbed.serve.cost import Deployment
from testbed.serve.instance import BatchPolicy, Instance, StopBefore
from testbed.serve.kv_cache import PagedKVCache
from testbed.serve.proxy import EXPERTS, ProxyModel
from testbed.serve.records import Iteration
from testbed.serve.requests import Request
from testbed.serve.workspace import MemoryPlan, Workspace

#: the data plane's group epoch of serving's groups: above any epoch a training run before it used
SERVE_EPOCH = 2**31


@dataclass(frozen=True)
class InstanceConfig:
    """What an NPU needs to serve as one instance."""

    name: str
    deployment: Deployment
    blocks: int
    block_tokens: int
    policy: BatchPolicy
    seed: int
    #: what a training job beside it takes from it
    interference: Interference = field(default_factory=Interference)
    #: the ranks of its group, whose processes run it together (empty: one process, whole)
    group: tuple[int, ...] = ()
    #: ``both``, or under prefill/decode disaggregation ``prefill`` or ``decode``
    role: str = "both"
    #: its activation memory (None: not modelled)
    memory: MemoryPlan | None = None

    def instance(self, rank: int | None = None) -> Instance:
        """A fresh instance: an empty cache, nothing waiting; on ``rank`` of its group, that
        rank's part of the proxy (whole without a group or a rank)."""
        d = self.deployment
        per_token = max(1, round(d.kv_bytes_per_token()))
        cache = PagedKVCache(self.blocks, self.block_tokens, per_token)
        part = (self.group.index(rank), len(self.group)) if rank is not None and self.group else (0, 1)
        experts = EXPERTS if d.model.experts else 0
        proxy = ProxyModel(self.seed, part=part, experts=experts)
        inst = Instance(self.name, d, cache, self.policy, proxy, self.seed)
        inst.interference = self.interference
        inst.role = self.role
        if self.memory is not None:
            inst.workspace = Workspace(self.memory, rank if rank is not None else 0)
        return inst


class ServeRank:
    """The serving calls of an NPU process (a mixin: it needs ``rank``, ``spec`` and
    ``supervisor`` from the program it joins)."""

    rank: int
    spec: Any
    supervisor: Any
    ep: Endpoint
    _serving: Instance | None = None

    def serve_open(self, config: InstanceConfig, addresses: dict[int, list[Any]] | None = None) -> str:
        """Become instance ``config.name`` (again, after a restart: empty); in a group, this
        rank's part of it, its group's links on the data plane at ``addresses``."""
        inst = config.instance(self.rank)
        if len(config.group) > 1:
            if addresses is None:
                raise TestbedError(f"rank {self.rank}: a group of ranks needs their addresses; pass them")
            self.ep.new_epoch(SERVE_EPOCH, {int(r): tuple(a) for r, a in addresses.items()})
            comm = Communicator(self.ep, f"serve-{config.name}", list(config.group))
            inst.group = InstanceGroup(self.ep, comm).at
        self._serving = inst
        return config.name

    def serve_advance(
        self,
        now: float,
        until: float,
        arrived: list[tuple[Request, tuple[int, ...], tuple[np.ndarray, ...] | None]],
        die_at: float | None = None,
        die_rank: int | None = None,
    ) -> list[Iteration]:
        """Queue ``arrived`` (each with the tokens it already streamed and, sent by a prefill
        instance, its cache: one part per rank of the group) and iterate from ``now``
        while busy and before ``until``. With ``die_at``: the iteration that spans it is where the
        process of ``die_rank`` (default: this one) dies; if it is not this call's first, the call
        ends before it (its work undone), so that what came before reaches the router and the next
        call dies at once. The rest of its group go on into the iteration's collectives, which the
        death ends."""
        inst = self._serving
        if inst is None:
            raise TestbedError(f"rank {self.rank}: serve_advance before serve_open; open the instance first")
        for request, tokens, parts in arrived:
            inst.submit(request, tokens, None if parts is None else parts[inst.proxy.part[0]])
        calls = itertools.count()

        def strike(start: float, end: float, doing: str) -> None:
            first = next(calls) == 0
            if die_at is None or not start <= die_at < end:
                return
            if not first:
                raise StopBefore  # undone: the next call's first iteration is where it dies
            if die_rank is not None and die_rank != self.rank:
                return  # a peer of the dying rank: its allreduce meets the death
            self.supervisor.signal("kill", self.rank, die_at, -1, doing)
            time.sleep(self.spec.guard_s)
            raise HarnessHang(
                f"rank {self.rank}: still serving after its supervisor's signal", rank=self.rank
            )

        return inst.advance(now, until, strike, undoable=die_at is not None and die_at >= now)


class InstanceGroup:
    """A part's collectives with the rest of its instance on the fabric (the proxy's bytes), on this
    rank's virtual clock from an iteration's start. The iteration's length stays the cost model's,
    which times the deployment's TP allreduces and EP dispatch and combine by their closed forms."""

    def __init__(self, ep: Endpoint, comm: Communicator) -> None:
        self.ep, self.comm = ep, comm

    def at(self, now: float) -> InstanceGroup:
        """The group, its rank's clock at ``now`` (an iteration's start)."""
        self.ep.clock.advance_to(now)
        return self

    def allreduce(self, x: np.ndarray) -> np.ndarray:
        """The sum of every part's ``x``."""
        return self.comm.allreduce(x, "sum")

    def allgather(self, x: np.ndarray) -> np.ndarray:
        """Every part's ``x``, flattened and concatenated in group order."""
        return self.comm.allgather(x)

    def alltoall(self, blocks: list[np.ndarray]) -> list[np.ndarray]:
        """Block ``j`` to part ``j``; what each part sent here."""
        return self.comm.alltoall(blocks)
