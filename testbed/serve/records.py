"""What a serving instance holds and reports: a request on it (:class:`Live`) and one iteration's
record (:class:`Iteration`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from testbed.serve.requests import Request


@dataclass(eq=False)
class Live:
    """A request on an instance: what it has generated and its proxy state."""

    request: Request
    prompt: np.ndarray
    tokens: list[int] = field(default_factory=list)
    state: np.ndarray | None = None
    #: its cache is in host memory (preempted by swapping): re-admitted, it is copied back, not recomputed
    swapped: bool = False
    #: its cache came over the fabric from a prefill instance: admitted, nothing is recomputed
    received: bool = False

    @property
    def context(self) -> int:
        """Tokens in its cache: the prompt and every generated token but the newest."""
        return len(self.prompt) + max(0, len(self.tokens) - 1)

    @property
    def done(self) -> bool:
        """It has all its output tokens."""
        return len(self.tokens) >= self.request.output_tokens


@dataclass(frozen=True)
class Iteration:
    """What one iteration did: its start and length, the tokens it streamed (request, token; all at
    its end), who was prefilled, who finished, who failed (with the error's fields), who was
    preempted, and the cache after it."""

    start_s: float
    duration_s: float
    batch: int
    emitted: tuple[tuple[str, int], ...]
    prefilled: tuple[str, ...]
    finished: tuple[str, ...]
    failed: tuple[tuple[str, dict[str, object]], ...]
    preempted: tuple[str, ...]
    cache: dict[str, object]
    #: what training took from it: seconds its allreduce added, KV blocks its checkpoint staged in
    interference: dict[str, float] = field(default_factory=dict)
    #: bytes it swapped between HBM and host memory (out for preemption, back in for re-admission)
    swapped_bytes: int = 0
    #: on a prefill instance: the requests it prefilled and hands to a decode instance, each with
    #: the bytes of its KV cache (per NPU), which leave its cache at the iteration's end
    handoff: tuple[tuple[str, int], ...] = ()
    #: their cache states (the proxy's, this process's part of them), in ``handoff``'s order: the
    #: real data the transfer carries, not compared (a TP group's ranks hold different parts)
    states: tuple[object, ...] = field(default=(), compare=False)

    @property
    def end_s(self) -> float:
        """When its tokens reach their clients."""
        return self.start_s + self.duration_s
