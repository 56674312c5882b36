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
instance's group adds up. A proxy of a mixture-of-experts model has a
routed layer too (top-1, by the last token's id) of :data:`EXPERTS` expert
matrices, spread over the parts (expert parallelism, GShard): the parts
allgather their columns of the hidden state (Megatron-core's allgather token
dispatcher), each runs its own experts on the rows routed to them, and an
alltoall sends each part its columns of every row's expert output (the
combine). Integer sums are exact in any order, so the greedy tokens of ``n``
parts are the tokens of one.

Prefill and decode times are not the proxy's: they come from the modelled
deployment (:mod:`testbed.serve.cost`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

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


#: routed experts of a mixture-of-experts model's proxy (a divisor of every even split of the width)
EXPERTS = 64


class GroupOps(Protocol):
    """The collectives a part of the proxy runs with the other parts of its instance."""

    def allreduce(self, x: np.ndarray) -> np.ndarray:
        """The sum of every part's ``x``."""

    def allgather(self, x: np.ndarray) -> np.ndarray:
        """Every part's ``x``, flattened and concatenated in group order."""

    def alltoall(self, blocks: list[np.ndarray]) -> list[np.ndarray]:
        """Block ``j`` to part ``j``; what each part sent here."""


class ProxyModel:
    """Seeded integer weights: an embedding ``vocab x width`` and an output ``width x vocab``, and
    with ``experts`` that many ``width x width`` expert matrices; ``part``: (index, parts) of a
    split, holding columns ``np.array_split(range(width), parts)[index]`` of the embedding, those
    rows of the output, and experts ``index, index + parts, ...``."""

    def __init__(
        self, seed: int, shape: ProxyShape = ProxyShape(), part: tuple[int, int] = (0, 1), experts: int = 0
    ) -> None:
        index, parts = part
        if not 0 <= index < parts <= shape.width or (experts and (shape.width % parts or experts % parts)):
            raise TestbedError(
                f"proxy part {index} of {parts} does not split a width of {shape.width}"
                + (f" and {experts} experts evenly" if experts else "")
                + f"; give 0 <= index < parts <= {shape.width}"
                + (" with parts dividing both" if experts else ""),
                part=list(part),
            )
        rng = stream(seed, "serve", "proxy-weights")
        self.shape, self.part = shape, part
        embed = rng.integers(0, 2**10, size=(shape.vocab, shape.width), dtype=np.int64)
        out = rng.integers(0, 2**10, size=(shape.width, shape.vocab), dtype=np.int64)
        self.cols = list(np.array_split(np.arange(shape.width), parts))
        self.embed = np.ascontiguousarray(embed[:, self.cols[index]])
        self.out = np.ascontiguousarray(out[self.cols[index], :])
        self.experts = experts
        weights = stream(seed, "serve", "proxy-experts").integers(
            0, 2**10, size=(experts, shape.width, shape.width), dtype=np.int64
        )
        #: this part's experts, by their number
        self.own = {e: weights[e] for e in range(index, experts, parts)}

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

    def next_tokens(self, states: np.ndarray, last: np.ndarray, group: GroupOps | None = None) -> np.ndarray:
        """Greedy next tokens of a batch (the argmax of its logits, the lowest id on a tie):
        ``hidden = (state + embed[last]) mod p``; with experts, ``hidden += hidden @ expert[last mod
        E] mod p``; logits ``hidden @ out``. ``states``: ``batch x`` this part's width; ``last``: each
        request's last token. A part of a split runs the collectives with the others by ``group``."""
        if group is None and self.part[1] > 1:
            raise TestbedError(
                f"proxy part {self.part[0]} of {self.part[1]} holds part of the model only; "
                "pass its instance's group"
            )
        hidden = (states + self.embed[last]) % PRIME
        if self.experts:
            hidden = (hidden + self._experts(hidden, last, group)) % PRIME
        logits: np.ndarray = hidden @ self.out
        if group is not None:
            logits = group.allreduce(logits)
        return np.asarray(np.argmax(logits, axis=1), dtype=np.int64)

    def _experts(self, hidden: np.ndarray, last: np.ndarray, group: GroupOps | None) -> np.ndarray:
        """This part's columns of the routed layer's output for every row: the rows' whole hidden
        states gathered, each row through its expert on the part that holds it, and the outputs'
        columns sent to the parts that hold them."""
        parts = self.part[1]
        rows = len(hidden)
        whole = hidden
        if group is not None:
            pieces = group.allgather(np.ascontiguousarray(hidden)).reshape(parts, rows, -1)
            whole = np.concatenate(list(pieces), axis=1)
        routed = last % self.experts
        out = np.zeros_like(whole)
        for e, weight in self.own.items():
            mine = routed == e
            if mine.any():
                out[mine] = whole[mine] @ weight % PRIME
        if group is None:
            return out
        got = group.alltoall([np.ascontiguousarray(out[:, cols]) for cols in self.cols])
        combined: np.ndarray = sum(got[1:], got[0]) % PRIME
        return combined
