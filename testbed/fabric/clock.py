"""The per-rank virtual clock, and the link-setup time model.

Time advances only through the rank's own program order and the timestamps
carried by messages, never through host speed, so the same seed gives the same
times on any machine:

- compute: ``T += flops / (peak_flops * efficiency) * slowdown``
- send at ``T`` on link L: starts at ``max(T, egress_free)``, occupies the
  sender's egress for ``bytes / bw(L)``, arrives at ``start + latency(L) + bytes / bw(L)``
- its bytes then pass the receiver's ingress on that class of link (its UB or
  HCCS port, its RoCE NIC: separate hardware), which like the egress carries
  one message at a time at the link's rate: a message whose bytes would
  overlap another's on the same ingress lands later, in the earliest gap
  after its arrival (contention that arises: several senders into one
  receiver, an incast). Gaps are filled in the receiver's program order, so
  the same program gives the same times.
- receive: ``T = max(T, landed)``; the difference is this rank's comm wait.
"""

from __future__ import annotations

import math
from bisect import insort
from dataclasses import dataclass, field

from testbed.core.seeding import stream
from testbed.topology.presets import LinkClass, LinkSetupModel

#: Busy spans of a rank's ingress kept to place later messages in (older ones are forgotten: a
#: message is received within a few collectives of its arrival).
INGRESS_SPANS = 64
#: Rounding (in units of the last place of the arrival time) below which two busy spans of the
#: ingress touch rather than overlap.
INGRESS_SLACK_ULPS = 16


@dataclass
class RankClock:
    """One rank's virtual time (seconds) and what it has been spent on."""

    t: float = 0.0
    egress_free: float = 0.0
    compute_s: float = 0.0
    comm_wait_s: float = 0.0
    #: per class of link, (start, end, sender) of the spans its ingress is busy carrying bytes in, sorted
    ingress: dict[str, list[tuple[float, float, int]]] = field(default_factory=dict)
    #: per class of link, the latest end of any span since the reset (at least that of every span
    #: kept): a message whose bytes come after it needs no search
    ingress_end: dict[str, float] = field(default_factory=dict)

    def compute(self, flops: float, peak_flops: float, efficiency: float, slowdown: float = 1.0) -> float:
        """Charge ``flops`` of compute; returns the seconds charged."""
        dt = flops / (peak_flops * efficiency) * slowdown
        self.t += dt
        self.compute_s += dt
        return dt

    def send(self, nbytes: float, link: LinkClass) -> float:
        """Charge a send of ``nbytes`` on ``link``; returns the message's arrival time."""
        start = max(self.t, self.egress_free)
        occupy = nbytes / link.bandwidth_Bps
        self.egress_free = start + occupy
        return start + link.latency_s + occupy

    def land(self, arrival: float, occupy: float, link: str = "", src: int = -1) -> float:
        """When a message from ``src`` whose last byte reaches this rank at ``arrival``, after ``occupy``
        seconds of bytes, has passed the ingress of its class of ``link``: at ``arrival`` if the ingress
        was free for its bytes, else at the end of the earliest gap after them that holds them. A
        sender's own earlier messages never hold it up: its egress already sent them one after another
        (a modelled job's latencies, added per call, may make its arrivals overlap on paper)."""
        if occupy <= 0.0:
            return arrival
        spans = self.ingress.setdefault(link, [])
        start = first = arrival - occupy
        # spans that touch within float rounding do not overlap: a sender's back-to-back messages
        slack = INGRESS_SLACK_ULPS * math.ulp(arrival)
        if not spans or self.ingress_end.get(link, -math.inf) <= start + slack:
            insort(spans, (start, arrival, src))  # after every span kept: the usual case, no search
            self.ingress_end[link] = max(self.ingress_end.get(link, -math.inf), arrival)
            if len(spans) > INGRESS_SPANS:
                del spans[0]
            return arrival
        for busy_from, busy_to, sender in spans:
            if sender == src and src >= 0:
                continue
            if busy_to <= start + slack:
                continue
            if busy_from >= start + occupy - slack:
                break
            start = busy_to
        landed = arrival if start == first else start + occupy
        insort(spans, (landed - occupy, landed, src))
        self.ingress_end[link] = max(self.ingress_end[link], landed)
        if len(spans) > INGRESS_SPANS:
            del spans[0]
        return landed

    def receive(self, arrival: float) -> float:
        """Advance to a message's ``arrival``; returns the comm wait it cost."""
        wait = max(0.0, arrival - self.t)
        self.t += wait
        self.comm_wait_s += wait
        return wait

    def advance_to(self, t: float) -> None:
        """Jump forward to ``t`` (restart, barrier); never moves backwards."""
        self.t = max(self.t, t)
        self.egress_free = max(self.egress_free, self.t)

    def reset(self, t: float) -> None:
        """Set the clock to ``t`` exactly (a fresh process at job start)."""
        self.t = t
        self.egress_free = t
        self.ingress.clear()
        self.ingress_end.clear()


def link_setup_s(model: LinkSetupModel, seed: int, key: tuple[object, ...], links_at_once: int) -> float:
    """Virtual seconds to set up one link, identified by ``key`` (epoch, group, algorithm, src, dst).

    ``base + jitter * u + per_concurrent_link * links_at_once`` with ``u`` drawn
    from the seeded stream of ``key``.
    """
    u = float(stream(seed, "linksetup", *key).random())
    return model.base_s + model.jitter_s * u + model.per_concurrent_link_s * links_at_once
