"""Serving on an NPU process: the calls a serving instance answers.

:class:`ServeRank` is mixed into the NPU program the NPU host runs
(:mod:`testbed.actors.npu_host`), so a serving instance lives in a real NPU
process beside the training program's state: its KV cache, its scheduler and
its proxy model are that process's memory, and a SIGKILL of the process
loses them. The controller opens the instance, then calls ``serve_iterate``
once per iteration with the requests routed to it since the last one.

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

from testbed.core.errors import HarnessHang, TestbedError
from testbed.serve.colocation import Interference
from testbed.serve.cost import Deployment
from testbed.serve.instance import BatchPolicy, Instance, Iteration, StopBefore
from testbed.serve.kv_cache import PagedKVCache
from testbed.serve.proxy import ProxyModel
from testbed.serve.requests import Request


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

    def instance(self) -> Instance:
        """A fresh instance: an empty cache, nothing waiting."""
        d = self.deployment
        per_token = max(1, round(d.kv_bytes_per_token()))
        cache = PagedKVCache(self.blocks, self.block_tokens, per_token)
        inst = Instance(self.name, d, cache, self.policy, ProxyModel(self.seed), self.seed)
        inst.interference = self.interference
        return inst


class ServeRank:
    """The serving calls of an NPU process (a mixin: it needs ``rank``, ``spec`` and
    ``supervisor`` from the program it joins)."""

    rank: int
    spec: Any
    supervisor: Any
    _serving: Instance | None = None

    def serve_open(self, config: InstanceConfig) -> str:
        """Become instance ``config.name`` (again, after a restart: empty)."""
        self._serving = config.instance()
        return config.name

    def serve_advance(
        self,
        now: float,
        until: float,
        arrived: list[tuple[Request, tuple[int, ...]]],
        die_at: float | None = None,
    ) -> list[Iteration]:
        """Queue ``arrived`` (each with the tokens it already streamed) and iterate from ``now``
        while busy and before ``until``. With ``die_at``: the iteration that spans it is where the
        process dies; if it is not this call's first, the call ends before it (its work undone),
        so that what came before reaches the router and the next call dies at once."""
        inst = self._serving
        if inst is None:
            raise TestbedError(f"rank {self.rank}: serve_advance before serve_open; open the instance first")
        for request, tokens in arrived:
            inst.submit(request, tokens)
        calls = itertools.count()

        def strike(start: float, end: float) -> None:
            first = next(calls) == 0
            if die_at is None or not start <= die_at < end:
                return
            if not first:
                raise StopBefore  # undone: the next call's first iteration is where it dies
            self.supervisor.signal("kill", self.rank, die_at, -1, "decode")
            time.sleep(self.spec.guard_s)
            raise HarnessHang(
                f"rank {self.rank}: still serving after its supervisor's signal", rank=self.rank
            )

        return inst.advance(now, until, strike, undoable=die_at is not None and die_at >= now)
