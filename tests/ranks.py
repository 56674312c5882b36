"""Test helper: a parallel job of NPU programs as threads in this process (no Ray), step by step."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from testbed.topology.layout import Layout
from testbed.topology.presets import PRESETS, Topology
from testbed.train.npu import NPU
from testbed.train.rank_spec import RankSpec
from workloads import WORKLOADS
from workloads.blockspec import Arrays, assemble, options_of


def on_all(npus: list[NPU], method: str, *args: Any, wall_s: float = 60.0) -> list[Any]:
    """Call ``method`` on every NPU at once (a thread each); each result or the exception raised."""
    out: list[Any] = [None] * len(npus)

    def call(i: int) -> None:
        try:
            out[i] = getattr(npus[i], method)(*args)
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(len(npus))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=wall_s)
    assert not any(t.is_alive() for t in threads), f"{method} still running after {wall_s} s"
    return out


class Job:
    """A ``layout`` job of the transformer workload (or ``workload``) on threads."""

    def __init__(
        self,
        layout: Layout,
        options: dict[str, Any],
        seed: int,
        *,
        steps: int = 100,
        workload: str = "transformer",
        supernodes: int | None = None,
        guard_s: float = 20.0,
    ) -> None:
        world = layout.world
        nodes = supernodes or (2 if world % 2 == 0 else 1)
        self.layout, self.options = layout, {**options, "steps": steps}
        spec = RankSpec(
            Topology(PRESETS["atlas-900-a3"], nodes, world // nodes),
            seed=seed,
            workload_factory=WORKLOADS[workload].factory,
            workload_options=self.options,
            connect_timeout_s=120.0,
            exec_timeout_s=1836.0,
            guard_s=guard_s,
            layout=layout,
        )
        self.npus = [NPU(r, spec) for r in range(world)]
        self.addresses = {r: list(n.dataplane.address) for r, n in enumerate(self.npus)}
        self.epoch = -1

    def open(self, t0: float = 0.0) -> list[Any]:
        """Open a new group epoch on every rank."""
        self.epoch += 1
        return on_all(self.npus, "open_group", self.epoch, self.addresses, t0)

    def step(self, step: int) -> list[Any]:
        """Train ``step`` on every rank; each rank's outcome (a dict or an exception)."""
        return on_all(self.npus, "train_step", step)

    def train(self, first: int, last: int) -> list[float]:
        """Train ``first..last``; the global loss of each step (raises the first rank error)."""
        losses = []
        for s in range(first, last + 1):
            out = self.step(s)
            for o in out:
                if isinstance(o, Exception):
                    raise o
            losses.append(float(np.mean([o["loss"] for o in out if o["loss"] is not None])))
        return losses

    def full_params(self) -> Arrays:
        """The model's parameters put together from every rank."""
        parts = {r: n.workload.state("params") for r, n in enumerate(self.npus)}
        return assemble(options_of(self.options), self.layout, parts)

    def full_moment(self) -> Arrays:
        """Adam's first moment put together from every rank (linear in the gradients, unlike the update)."""
        parts = {r: self._moment_of(r) for r in range(len(self.npus))}
        return assemble(options_of(self.options), self.layout, parts)

    def _moment_of(self, rank: int) -> Arrays:
        """``rank``'s first moment by parameter; with ``zero: 1`` joined from its group's shards."""
        w = self.npus[rank].workload
        if not w.sharded:
            return {k: w.m[k] for k in w.params}
        out: Arrays = {}
        for group, state in w.sharded.items():
            members = self.layout.group(rank, ("dp", "ep") if group == "replica" else ("dp",))
            flat = np.concatenate([self.npus[m].workload.sharded[group].m for m in members])
            out.update(state.unflatten(flat))
        return out

    def close(self) -> None:
        """Close every data plane."""
        on_all(self.npus, "close")

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
