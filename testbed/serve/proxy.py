"""The serving proxy: a small numpy language model whose greedy tokens are exact.

A request's prompt tokens are drawn from the scenario's seed and its id; each
next token is the argmax of logits computed from a position-weighted sum of
the embeddings of every token so far (the proxy's KV cache: one key per
token, summed) and the last token's own embedding. All of it is integer
arithmetic modulo a prime, so a token never depends on the batch it was
computed in, the NPU that computed it, or whether its cache was kept,
recomputed after a preemption, or rebuilt on another NPU after a failure:
"token-identical to an undisturbed run" is an exact comparison.

Under tensor parallelism the proxy splits as Megatron-LM splits a layer
(Shoeybi et al. 2019): part ``i`` of ``n`` holds its share of the hidden
width, so its cache state and its rows of the output projection are only
those columns, and its logits are partial sums that an allreduce over the
instance's TP group adds up (:meth:`ProxyModel.partial_logits`). Integer
sums are exact in any order, so the greedy tokens of ``n`` parts are the
tokens of one.

Prefill and decode times are not the proxy's: they come from the modelled
deployment (:mod:`testbed.serve.cost`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from testbed.core.errors import TestbedError
from testbed.core.seeding import stream

#: A prime below 2**21: hidden values stay below it, so a logit (a sum of ``width`` products with
#: weights below 2**10) stays far inside int64.
PRIME = 2_097_143


@dataclass(frozen=True)
class ProxyShape:
    """The proxy's vocabulary and hidden width."""

    vocab: int = 512
    width: int = 64


#: what sums a batch's partial logits over the TP group (an allreduce); None: the proxy is whole
Reduce = Callable[[np.ndarray], np.ndarray]


class ProxyModel:
    """Seeded integer weights: an embedding ``vocab x width`` and an output ``width x vocab``;
    ``part``: (index, parts) of a TP split, holding columns ``np.array_split(range(width), parts)
    [index]`` of the embedding and those rows of the output."""

    def __init__(self, seed: int, shape: ProxyShape = ProxyShape(), part: tuple[int, int] = (0, 1)) -> None:
        index, parts = part
        if not 0 <= index < parts <= shape.width:
            raise TestbedError(
                f"proxy part {index} of {parts} does not split a width of {shape.width}; "
                f"give 0 <= index < parts <= {shape.width}",
                part=list(part),
            )
        rng = stream(seed, "serve", "proxy-weights")
        self.shape, self.part = shape, part
        embed = rng.integers(0, 2**10, size=(shape.vocab, shape.width), dtype=np.int64)
        out = rng.integers(0, 2**10, size=(shape.width, shape.vocab), dtype=np.int64)
        cols = np.array_split(np.arange(shape.width), parts)[index]
        self.embed = np.ascontiguousarray(embed[:, cols])
        self.out = np.ascontiguousarray(out[cols, :])

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

    def partial_logits(self, states: np.ndarray, last: np.ndarray) -> np.ndarray:
        """This part's share of a batch's logits: ``((state + embed[last]) mod p) @ out`` over its
        columns (all of them, whole). ``states``: ``batch x`` its width; ``last``: each request's
        last token."""
        hidden = (states + self.embed[last]) % PRIME
        out: np.ndarray = hidden @ self.out
        return out

    def next_tokens(self, states: np.ndarray, last: np.ndarray, reduce: Reduce | None = None) -> np.ndarray:
        """Greedy next tokens of a batch: the argmax of its logits, the lowest id on a tie; a part
        of a TP split sums its partial logits with the others' by ``reduce``."""
        logits = self.partial_logits(states, last)
        if reduce is not None:
            logits = reduce(logits)
        elif self.part[1] > 1:
            raise TestbedError(
                f"proxy part {self.part[0]} of {self.part[1]} holds partial logits only; "
                "pass the TP group's allreduce as reduce"
            )
        return np.asarray(np.argmax(logits, axis=1), dtype=np.int64)
