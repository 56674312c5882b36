"""netem on a link: loss, delay with jitter, duplicates, reordering, corruption and a rate cap.

The vocabulary is Linux netem's (tc-netem(8)) and Chaos Mesh's NetworkChaos.
The sending rank decides, per message, what the link does to it, from a
seeded stream of its own per fault and link (:class:`NetemLink`), so a run
decides the same on every machine. This module is the time model and the
draws; the data path (the corrupted copy that really travels, the checksum
that catches it, the duplicate discarded by sequence number) is
:mod:`testbed.collectives.netem_link`.

A message of ``nbytes`` on a link of latency ``L`` and bandwidth ``B`` (after
any ``link_degrade``), whose sender's egress is free at ``s``:

- rate: ``B' = min(B, rate)``, ``occupy = nbytes / B'`` (tc's rate caps the link);
- delay: ``L' = L + max(0, delay + jitter * (2u - 1))``: netem without a
  distribution table draws the delay uniformly in ``delay ± jitter``
  (``tabledist`` in the kernel's ``sch_netem.c``), and no packet leaves before it is sent;
- each transmission starting at ``s`` is lost with probability ``loss``: the
  sender sends it again when its retransmit timer fires, at ``s + max(rto, occupy)``
  (the RDMA NIC's retransmit timeout, ``4.096 us * 2^HCCL_RDMA_TIMEOUT``, 4.29 s at
  HCCL's default of 20);
- else it is corrupted with probability ``corrupt`` (one bit flipped at a random
  offset, as netem does): with a checksum the receiver discards it and asks
  again (a NAK, a round trip), so the clean copy starts at ``s + occupy + 2 L'``;
  without one it is delivered as it is;
- after :data:`RETRY_CNT` retransmissions of one message the link gives up, as
  an RDMA queue pair does, and the message is lost for good;
- ``arrival = s_last + L' + occupy``; the egress is busy until ``s_last + occupy``,
  and ``occupy`` longer when the link duplicates the message (probability ``duplicate``);
- reorder: every ``gap``-th message is a candidate (netem's counter), reordered
  with probability ``reorder``: it overtakes the ``gap`` messages before it, and
  the receiver, which delivers in order, holds it until they are in:
  ``gap * occupy`` later.

Each draw is correlated as netem's are (``get_crandom``):
``u_n = correlation * u_(n-1) + (1 - correlation) * fresh``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from testbed.core.seeding import stream

#: The RDMA NIC's retransmit timeout at HCCL's default: ``4.096 us * 2^HCCL_RDMA_TIMEOUT`` with
#: ``HCCL_RDMA_TIMEOUT=20`` (the CANN environment variable reference).
RDMA_RTO_S = 4.096e-6 * 2**20
#: Retransmissions of one message before the link gives up (``HCCL_RDMA_RETRY_CNT``'s default).
RETRY_CNT = 7


@dataclass(frozen=True)
class Netem:
    """What a ``link_netem`` fault does to each message (fractions in [0, 1), seconds, bytes/s)."""

    loss: float = 0.0
    correlation: float = 0.0
    delay_s: float = 0.0
    jitter_s: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    gap: int = 1
    corrupt: float = 0.0
    #: the link's bandwidth cap in bytes per second (None: none)
    rate_Bps: float | None = None
    #: the transport checks each message's CRC (False: a corrupted message is delivered as it is)
    checksum: bool = True
    rto_s: float = RDMA_RTO_S


@dataclass
class Transmission:
    """What the link did to one message, and when it arrives."""

    start: float
    arrival: float
    egress_free: float
    occupy: float
    latency: float
    #: each failed transmission before the last, in order: ``lost`` or ``corrupt``
    failed: list[str] = field(default_factory=list)
    #: the link gave up after :data:`RETRY_CNT` retransmissions: nothing arrives
    given_up: bool = False
    #: the delivered copy is corrupted (no checksum)
    corrupt: bool = False
    duplicate: bool = False
    #: seconds the receiver holds the message for reordering
    held_s: float = 0.0
    #: seconds the retransmissions added before the last transmission started
    retransmit_s: float = 0.0


class NetemLink:
    """The sending side's state of one fault on one directed link: its seeded stream, each draw's
    last value (for the correlation) and netem's reorder counter."""

    def __init__(self, seed: int, fault_id: str, src: int, dst: int) -> None:
        self.rng: np.random.Generator = stream(seed, "netem", fault_id, src, dst)
        self.last: dict[str, float] = {}
        self.counter = 0

    def draw(self, what: str, correlation: float) -> float:
        """The next draw of ``what`` in [0, 1), correlated with its previous one."""
        fresh = float(self.rng.random())
        prev = self.last.get(what)
        u = fresh if prev is None else correlation * prev + (1.0 - correlation) * fresh
        self.last[what] = u
        return u

    def chance(self, what: str, p: float, correlation: float) -> bool:
        """Whether the event of probability ``p`` happens (no draw when ``p`` is 0)."""
        return p > 0.0 and self.draw(what, correlation) < p

    def bit(self, nbits: int) -> int:
        """The bit a corruption flips, uniform over the message."""
        return int(self.rng.integers(nbits))

    def transmit(
        self, n: Netem, start: float, latency_s: float, bandwidth_Bps: float, nbytes: float, calls: float
    ) -> Transmission:
        """The message's fate and times (see the module's formulas); ``calls``: the modelled job's
        messages it stands for, each paying the added delay."""
        c = n.correlation
        bw = bandwidth_Bps if n.rate_Bps is None else min(bandwidth_Bps, n.rate_Bps)
        occupy = nbytes / bw
        extra = n.delay_s
        if n.jitter_s:
            extra += n.jitter_s * (2.0 * self.draw("jitter", c) - 1.0)
        latency = latency_s + max(0.0, extra) * calls
        first, corrupt = start, False
        failed: list[str] = []
        while len(failed) <= RETRY_CNT:
            if self.chance("loss", n.loss, c):
                failed.append("lost")
                start += max(n.rto_s, occupy)
            elif nbytes > 0 and self.chance("corrupt", n.corrupt, c):
                if not n.checksum:
                    corrupt = True
                    break
                failed.append("corrupt")
                start += occupy + 2.0 * latency
            else:
                break
        out = Transmission(start, start + latency + occupy, start + occupy, occupy, latency, failed)
        out.retransmit_s, out.corrupt = start - first, corrupt
        if len(failed) > RETRY_CNT:
            out.given_up = True
            return out
        if self.chance("duplicate", n.duplicate, c):
            out.duplicate = True
            out.egress_free += occupy
        if n.reorder > 0.0:
            if self.counter >= n.gap - 1 and self.chance("reorder", n.reorder, c):
                self.counter = 0
                out.held_s = n.gap * occupy
                out.arrival += out.held_s
            else:
                self.counter += 1
        return out
