"""Serving on an NPU process: the calls a serving instance answers.

:class:`ServeRank` is mixed into the NPU program the NPU host runs
(:mod:`testbed.actors.npu_host`), so a serving instance lives in a real NPU
process beside the training program's state: its KV cache, its scheduler and
its proxy model are that process's memory, and a SIGKILL of the process
loses them. The controller opens the instance, then calls ``serve_advance``
with the requests routed to it since the last call.

An instance with ``tp_ranks`` above one spans that many NPU processes, its
TP group: each holds its share of the proxy's width (its KV cache shard and
its rows of the output projection), runs the same scheduler on the same
requests, and every forward pass ends in a real allreduce of the group's
partial logits over the fabric. A SIGKILL of any one of them ends the
others' allreduce with :class:`~testbed.core.errors.PeerLost`: the instance
is lost, as a TP group is when one of its NPUs dies.

A death armed at a virtual time strikes in the iteration that spans it,
once the iteration's length is known and before any of its tokens exists:
the process asks its supernode for a SIGKILL, as a training rank does at a
point of a step (:mod:`testbed.train.rank_faults`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from testbed.collectives import Communicator, Endpoint
from testbed.core.errors import HarnessHang, TestbedError
from testbed.serve.colocation import Interference
from testbed.serve.cost import Deployment
from testbed.serve.instance import BatchPolicy, Instance, StopBefore
from testbed.serve.kv_cache import PagedKVCache
from testbed.serve.proxy import ProxyModel
from testbed.serve.records import Iteration
from testbed.serve.requests import Request

#: the data plane's group epoch of serving's TP groups: above any epoch a training run before it used
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
    #: the ranks of its TP group, whose processes run it together (empty: one process, whole)
    group: tuple[int, ...] = ()
    #: ``both``, or under prefill/decode disaggregation ``prefill`` or ``decode``
    role: str = "both"

    def instance(self, rank: int | None = None) -> Instance:
        """A fresh instance: an empty cache, nothing waiting; on ``rank`` of its TP group, that
        rank's part of the proxy (whole without a group or a rank)."""
        d = self.deployment
        per_token = max(1, round(d.kv_bytes_per_token()))
        cache = PagedKVCache(self.blocks, self.block_tokens, per_token)
        part = (self.group.index(rank), len(self.group)) if rank is not None and self.group else (0, 1)
        inst = Instance(self.name, d, cache, self.policy, ProxyModel(self.seed, part=part), self.seed)
        inst.interference = self.interference
        inst.role = self.role
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
        """Become instance ``config.name`` (again, after a restart: empty); in a TP group, this
        rank's part of it, its group's links on the data plane at ``addresses``."""
        inst = config.instance(self.rank)
        if len(config.group) > 1:
            if addresses is None:
                raise TestbedError(f"rank {self.rank}: a TP group needs the ranks' addresses; pass them")
            self.ep.new_epoch(SERVE_EPOCH, {int(r): tuple(a) for r, a in addresses.items()})
            group = Communicator(self.ep, f"serve-{config.name}", list(config.group))
            inst.allreduce = _allreduce_over(self.ep, group)
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
        call dies at once. The rest of its TP group go on into the iteration's allreduce, which the
        death ends."""
        inst = self._serving
        if inst is None:
            raise TestbedError(f"rank {self.rank}: serve_advance before serve_open; open the instance first")
        for request, tokens, parts in arrived:
            inst.submit(request, tokens, None if parts is None else parts[inst.proxy.part[0]])
        calls = itertools.count()

        def strike(start: float, end: float) -> None:
            first = next(calls) == 0
            if die_at is None or not start <= die_at < end:
                return
            if not first:
                raise StopBefore  # undone: the next call's first iteration is where it dies
            if die_rank is not None and die_rank != self.rank:
                return  # a peer of the dying rank: its allreduce meets the death
            self.supervisor.signal("kill", self.rank, die_at, -1, "decode")
            time.sleep(self.spec.guard_s)
            raise HarnessHang(
                f"rank {self.rank}: still serving after its supervisor's signal", rank=self.rank
            )

        return inst.advance(now, until, strike, undoable=die_at is not None and die_at >= now)


def _allreduce_over(ep: Endpoint, group: Communicator) -> Callable[[np.ndarray, float], np.ndarray]:
    """The instance's allreduce of partial logits: a sum of the proxy's bytes over ``group`` on the
    fabric, on this rank's virtual clock from the iteration's start. The iteration's length stays
    the cost model's, which times the deployment's TP allreduces by their closed forms."""

    def allreduce(partial: np.ndarray, at_s: float) -> np.ndarray:
        ep.clock.advance_to(at_s)
        return group.allreduce(partial, "sum")

    return allreduce
