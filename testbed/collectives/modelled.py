"""What one of the proxy's collectives stands for in a modelled job (docs/job.md, "In a run")."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Modelled:
    """The modelled job's collectives one of the proxy's stands for: how long they take on an idle
    fabric, as a latency part and a bandwidth part (their closed forms, at the job's group and
    message size), and the bytes of one of them, at which ``auto`` picks the algorithm.

    The proxy's collective then moves its own bytes, but each byte counts as many bytes, and
    each link's latency as many latencies, as make its own closed form's two parts the job's
    (:func:`scales`): on an idle fabric it takes the job's time, and a degraded or shared link
    slows it as it would slow the job's messages. Its links are set up with the load of the job's
    group (``group`` ranks) setting theirs up at once.
    """

    latency_s: float
    transfer_s: float
    per_call: int
    #: ranks of the job's group, for link setup (0: the proxy's own)
    group: int = 0


def scales(modelled: Modelled | None, latency_s: float, transfer_s: float) -> tuple[float, float]:
    """(bytes per byte, latencies per latency) that make a collective whose own closed form is
    ``latency_s + transfer_s`` take ``modelled``'s time (1, 1 for none)."""
    if modelled is None:
        return 1.0, 1.0
    byte_scale = modelled.transfer_s / transfer_s if transfer_s > 0 else 1.0
    return byte_scale, modelled.latency_s / latency_s if latency_s > 0 else 1.0
