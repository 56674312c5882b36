"""The per-rank virtual clock of DESIGN section 4.1, and the link-setup time model.

Time advances only through the rank's own program order and the timestamps
carried by messages, never through host speed, so the same seed gives the same
times on any machine:

- compute: ``T += flops / (peak_flops * efficiency) * slowdown``
- send at ``T`` on link L: starts at ``max(T, egress_free)``, occupies the
  sender's egress for ``bytes / bw(L)``, arrives at ``start + latency(L) + bytes / bw(L)``
- receive: ``T = max(T, arrival)``; the difference is this rank's comm wait.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.seeding import stream
from testbed.topology.presets import LinkClass, LinkSetupModel


@dataclass
class RankClock:
    """One rank's virtual time (seconds) and what it has been spent on."""

    t: float = 0.0
    egress_free: float = 0.0
    compute_s: float = 0.0
    comm_wait_s: float = 0.0

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


def link_setup_s(model: LinkSetupModel, seed: int, key: tuple[object, ...], links_at_once: int) -> float:
    """Virtual seconds to set up one link, identified by ``key`` (epoch, group, algorithm, src, dst).

    ``base + jitter * u + per_concurrent_link * links_at_once`` with ``u`` drawn
    from the seeded stream of ``key``.
    """
    u = float(stream(seed, "linksetup", *key).random())
    return model.base_s + model.jitter_s * u + model.per_concurrent_link_s * links_at_once
