"""The serving proxy: a small numpy language model whose greedy tokens are exact.

A request's prompt tokens are drawn from the scenario's seed and its id; each
next token is the argmax of logits computed from a position-weighted sum of
the embeddings of every token so far (the proxy's KV cache: one key per
token, summed) and the last token's own embedding. All of it is integer
arithmetic modulo a prime, so a token never depends on the batch it was
computed in, the NPU that computed it, or whether its cache was kept,
recomputed after a preemption, or rebuilt on another NPU after a failure:
"token-identical to an undisturbed run" is an exact comparison.

Prefill and decode times are not the proxy's: they come from the modelled
deployment (:mod:`testbed.serve.cost`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from testbed.core.seeding import stream

#: A prime below 2**21: hidden values stay below it, so a logit (a sum of ``width`` products with
#: weights below 2**10) stays far inside int64.
PRIME = 2_097_143


@dataclass(frozen=True)
class ProxyShape:
    """The proxy's vocabulary and hidden width."""

    vocab: int = 512
    width: int = 64


class ProxyModel:
    """Seeded integer weights: an embedding ``vocab x width`` and an output ``width x vocab``."""

    def __init__(self, seed: int, shape: ProxyShape = ProxyShape()) -> None:
        rng = stream(seed, "serve", "proxy-weights")
        self.shape = shape
        self.embed = rng.integers(0, 2**10, size=(shape.vocab, shape.width), dtype=np.int64)
        self.out = rng.integers(0, 2**10, size=(shape.width, shape.vocab), dtype=np.int64)

    def prompt(self, seed: int, request: str, tokens: int) -> np.ndarray:
        """The prompt of ``request``: ``tokens`` token ids from its own stream."""
        return stream(seed, "serve", "prompt-tokens", request).integers(0, self.shape.vocab, size=tokens)

    def prefill(self, tokens: np.ndarray) -> np.ndarray:
        """The cache state after ``tokens``: ``sum_i (i + 1) embed[t_i]`` modulo :data:`PRIME`."""
        weights = np.arange(1, len(tokens) + 1, dtype=np.int64)[:, None]
        return (self.embed[tokens] * weights % PRIME).sum(axis=0) % PRIME

    def extend(self, state: np.ndarray, position: int, token: int) -> np.ndarray:
        """The state after one more token at 0-based ``position``."""
        return (state + self.embed[token] * (position + 1) % PRIME) % PRIME

    def next_tokens(self, states: np.ndarray, last: np.ndarray) -> np.ndarray:
        """Greedy next tokens of a batch: ``argmax((state + embed[last]) mod p @ out)``, the lowest id
        on a tie. ``states``: ``batch x width``; ``last``: each request's last token."""
        hidden = (states + self.embed[last]) % PRIME
        return np.asarray(np.argmax(hidden @ self.out, axis=1), dtype=np.int64)
