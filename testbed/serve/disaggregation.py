"""Prefill/decode disaggregation: one pool of instances prefills, another decodes, and each
request's KV cache crosses the fabric between them.

As DistServe (Zhong et al., OSDI 2024), Mooncake (Qin et al., 2024) and
CloudMatrix-Infer serve: a new request goes to a prefill instance; its
prefill gives its first token, and its cache (the proxy's real state, each
TP rank its own part) goes to the decode instance with the fewest requests
held or on their way; the decode instance admits it without recomputing
anything once the transfer ends, ``latency + bytes / bandwidth`` of the link
between the two instances' NPUs later (each NPU of a TP group sends its own
part at once). The prefill instance's blocks are free at its iteration's
end (the cache is sent from a staging copy); the transfer is not overlapped
with the prefill, so its whole time falls between the first token and the
second: an upper bound on what disaggregation costs a request's TPOT.

A request moved off a lost instance with tokens already streamed goes to the
decode pool and is recomputed there; one still without a token starts again
in the prefill pool. A transfer whose decode instance was lost meanwhile is
moved the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Pools:
    """The prefill and decode instances by name, and ``transfer_s(src, dst, bytes)``: how long a
    cache of ``bytes`` per NPU takes from instance ``src`` to ``dst``."""

    prefill: tuple[str, ...]
    decode: tuple[str, ...]
    transfer_s: Callable[[str, str, int], float]


@dataclass
class Handoffs:
    """The caches on their way from the prefill pool to the decode pool."""

    pools: Pools
    #: request to (the decode instance it goes to, its cache state)
    in_flight: dict[str, tuple[str, object]] = field(default_factory=dict)

    def pool(self, decoding: bool, live: list[str]) -> list[str]:
        """Of ``live``, the instances a request goes to: the decode pool if it already has tokens
        (``decoding``), else the prefill pool; every live one if its pool is all lost."""
        names = self.pools.decode if decoding else self.pools.prefill
        return [n for n in live if n in names] or live

    def send(self, rid: str, state: object, live: list[str], load: dict[str, int]) -> str:
        """Send request ``rid``'s cache to the decode instance of ``live`` with the least ``load``
        (requests held) and fewest caches on their way; its name."""
        going = {n: sum(d == n for d, _ in self.in_flight.values()) for n in live}
        dst = min(self.pool(True, live), key=lambda n: (load[n] + going.get(n, 0), live.index(n)))
        self.in_flight[rid] = (dst, state)
        return dst

    def receive(self, rid: str) -> tuple[str, object] | None:
        """Request ``rid``'s cache has arrived: where, and what (None: it was not sent)."""
        return self.in_flight.pop(rid, None)
