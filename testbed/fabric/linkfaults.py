"""The link faults in force, as windows of virtual time that every rank consults when it sends.

The controller resolves each injected link fault into :class:`LinkFault`
records with absolute virtual-time windows and pushes the whole table to every
rank; the sender of a message applies it (a dropped link delivers a drop
marker instead of data, a degraded one is slower), so the effect depends only
on virtual time and is the same on every run.

A record may instead be *anchored* to a point of a step (``during:
allreduce``, say): its window is then relative, and each rank starts it at
its own virtual time when it reaches that point (:meth:`LinkFaultTable.anchored_at`).
Until then it is in force nowhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from testbed.core.seeding import stream
from testbed.fabric.netem import Netem

INF = math.inf


@dataclass(frozen=True)
class LinkFault:
    """One fault on the directed link ``src -> dst`` during ``[t0, t1)`` (``dst`` -1: a rank's stack)."""

    fault_id: str
    kind: str  # drop | degrade | setup_delay | version | netem
    src: int
    dst: int
    t0: float = 0.0
    t1: float = INF
    bw_factor: float = 1.0
    add_latency_s: float = 0.0
    jitter_s: float = 0.0
    setup_delay_s: float = 0.0
    version: str = ""
    #: what a ``netem`` record does to each message (:mod:`testbed.fabric.netem`)
    netem: Netem | None = None
    #: (step, point) the window starts at, relative to the rank's clock there; None: absolute
    anchor: tuple[int, str] | None = None

    def active(self, t: float) -> bool:
        """True at virtual time ``t`` (never while anchored to a point not reached yet)."""
        return self.anchor is None and self.t0 <= t < self.t1


@dataclass(frozen=True)
class LinkFaultTable:
    """Every link fault of the run; immutable, replaced as a whole on inject and heal."""

    faults: tuple[LinkFault, ...] = field(default_factory=tuple)

    def on(self, kind: str, src: int, dst: int, t: float) -> list[LinkFault]:
        """Faults of ``kind`` active on ``src -> dst`` at ``t``."""
        return [f for f in self.faults if f.kind == kind and f.src == src and f.dst == dst and f.active(t)]

    def dropped(self, src: int, dst: int, t: float) -> LinkFault | None:
        """The drop in force on the link at ``t``, if any."""
        found = self.on("drop", src, dst, t)
        return found[0] if found else None

    def degraded(self, src: int, dst: int, t: float, seed: int, msg: str) -> tuple[float, float]:
        """(bandwidth factor, added latency) at ``t``; jitter drawn per message from the seed."""
        factor, extra = 1.0, 0.0
        for f in self.on("degrade", src, dst, t):
            factor *= f.bw_factor
            extra += f.add_latency_s
            if f.jitter_s:
                extra += f.jitter_s * float(stream(seed, "jitter", f.fault_id, msg).random())
        return factor, extra

    def setup_delay(self, src: int, dst: int, t: float) -> float:
        """Extra link-setup seconds in force on the link at ``t``."""
        return sum(f.setup_delay_s for f in self.on("setup_delay", src, dst, t))

    def version_of(self, rank: int, t: float, default: str) -> str:
        """The communication-stack version ``rank`` reports at ``t``."""
        found = self.on("version", rank, -1, t)
        return found[-1].version if found else default

    def anchors(self) -> set[tuple[int, str]]:
        """The (step, point) pairs some record waits for."""
        return {f.anchor for f in self.faults if f.anchor is not None}

    def anchored_at(self, step: int, point: str, t: float) -> tuple[LinkFaultTable, list[str]]:
        """The table with the records anchored at ``(step, point)`` started at ``t``, and their fault
        ids."""
        return self.resolved(lambda f: f.anchor == (step, point), t)

    def resolved(self, which: Callable[[LinkFault], bool], t: float) -> tuple[LinkFaultTable, list[str]]:
        """The table with the anchored records ``which`` selects started at ``t``; their fault ids."""
        out, ids = [], []
        for f in self.faults:
            if f.anchor is not None and which(f):
                out.append(replace(f, anchor=None, t0=t + f.t0, t1=t + f.t1))
                ids.append(f.fault_id)
            else:
                out.append(f)
        return LinkFaultTable(tuple(out)), sorted(set(ids))

    def without(self, fault_id: str) -> LinkFaultTable:
        """The table with every record of ``fault_id`` removed (heal)."""
        return LinkFaultTable(tuple(f for f in self.faults if f.fault_id != fault_id))

    def plus(self, records: list[LinkFault]) -> LinkFaultTable:
        """The table with ``records`` added (inject)."""
        return LinkFaultTable((*self.faults, *records))
