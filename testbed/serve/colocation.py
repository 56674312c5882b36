"""Serving beside training on one supernode: what training's bursts do to a serving instance.

Training's timeline, read from its journal, is a list of windows of virtual
time: each step's gradient allreduce (the end of the step, as long as its
slowest rank waited on collectives) and each checkpoint's write (ending when
the checkpoint was committed). Inside an allreduce window, training's traffic
fills the links serving's collectives use: serving gets ``link_share`` of
their bandwidth, so the bytes part of an iteration's collectives takes
``1 / link_share`` as long, and each of its messages waits behind one segment
of training's (``queue_bytes``) at every hop, so each hop's latency grows by
``queue_bytes / bandwidth`` (head-of-line blocking). Inside a checkpoint window, the checkpoint's
staging buffers take ``staging_blocks`` of the device memory pool the KV
cache lives in (as many as are free when the write starts): requests wait
for room, or are preempted, until the write ends.

A policy protects serving: ``priority`` gives serving's traffic the links
first (its share 1) and reserves its KV blocks (staging goes to host memory
instead); ``none`` shares both. What that costs training (a slower allreduce,
staging elsewhere) is not modelled: the effect runs one way, training to
serving.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from testbed.topology.presets import LinkClass

#: what protects serving from training's bursts
POLICIES = ("none", "priority")
#: the block holder a checkpoint's staging appears as in the KV cache
STAGING = "checkpoint-staging"


@dataclass(frozen=True)
class Window:
    """A stretch of virtual time in which something acts on a serving instance: training does
    ``kind`` (``allreduce``, ``checkpoint``), or a fault slows it (``straggler``: its compute and
    reads ``factor`` times as long; ``link``: its links' bandwidth times ``factor``, each hop
    ``add_latency_s`` longer; ``fragment``: a pattern ``pin`` holds its activation memory)."""

    start_s: float
    end_s: float
    kind: str
    factor: float = 1.0
    add_latency_s: float = 0.0
    #: ``fragment``: (block bytes, count, spacing bytes) of the pattern pinned in activation memory
    pin: tuple[int, ...] = ()

    def holds(self, t: float) -> bool:
        """``t`` falls in it."""
        return self.start_s <= t < self.end_s


@dataclass(frozen=True)
class Interference:
    """Training's windows and what each takes from serving."""

    windows: tuple[Window, ...] = ()
    link_share: float = 1.0
    staging_blocks: int = 0
    #: bytes of training's traffic a serving message waits behind at each hop of a busy link
    queue_bytes: float = 0.0

    def during(self, t: float, kind: str) -> Window | None:
        """The window of ``kind`` that holds ``t``, if any."""
        return next((w for w in self.windows if w.kind == kind and w.holds(t)), None)

    def link_extra_s(self, t: float, latency_s: float, transfer_s: float, link: LinkClass) -> float:
        """What an iteration starting at ``t`` loses to training's allreduce on its ``link``s, its
        collectives taking ``latency_s`` in hops (``latency_s / link.latency_s`` of them) and
        ``transfer_s`` in bytes."""
        if self.during(t, "allreduce") is None:
            return 0.0
        hops = latency_s / link.latency_s
        return transfer_s * (1.0 / self.link_share - 1.0) + hops * self.queue_bytes / link.bandwidth_Bps

    def fault_extra_s(
        self, t: float, busy_s: float, latency_s: float, transfer_s: float, link: LinkClass
    ) -> float:
        """What an iteration starting at ``t`` loses to a fault in force: a straggler stretches its
        ``busy_s`` (compute or reads), a degraded link its collectives' bytes and hops."""
        extra = 0.0
        slow = self.during(t, "straggler")
        if slow is not None:
            extra += busy_s * (slow.factor - 1.0)
        degraded = self.during(t, "link")
        if degraded is not None:
            hops = latency_s / link.latency_s
            extra += transfer_s * (1.0 / degraded.factor - 1.0) + hops * degraded.add_latency_s
        return extra

    def with_windows(self, windows: Iterable[Window]) -> Interference:
        """The same, with ``windows`` added."""
        return replace(
            self, windows=tuple(sorted((*self.windows, *windows), key=lambda w: (w.start_s, w.kind)))
        )

    def only(self, *kinds: str) -> Interference:
        """The same, with only windows of ``kinds`` (what each burst alone would do)."""
        return replace(self, windows=tuple(w for w in self.windows if w.kind in kinds))

    def under(self, policy: str) -> Interference:
        """What is left of it under ``policy``: ``priority`` leaves the windows harmless."""
        if policy == "priority":
            return replace(self, link_share=1.0, staging_blocks=0, queue_bytes=0.0)
        return self


def training_windows(events: Iterable[dict[str, Any]]) -> tuple[Window, ...]:
    """The windows of a training journal's main phase: each step's gradient sync at its end (the
    longest any rank waited on collectives), each checkpoint's write before its commit."""
    out = []
    for e in events:
        if e.get("phase", "main") != "main":
            continue
        if e.get("event") == "step_end" and e.get("comm_wait_s"):
            wait = max(e["comm_wait_s"])
            if wait > 0:
                out.append(Window(e["t"] - wait, e["t"], "allreduce"))
        elif e.get("event") == "checkpoint_committed" and e.get("write_s"):
            out.append(Window(e["t"] - e["write_s"], e["t"], "checkpoint"))
    return tuple(sorted(out, key=lambda w: (w.start_s, w.kind)))
