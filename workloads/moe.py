"""The MoE block across an expert-parallel group: top-k gate, all-to-all dispatch, experts, combine.

Every rank of the EP group routes its own tokens; the experts are spread over
the group, ``experts / ep`` per rank. Dispatch is two all-to-alls (the token
count per expert, then the tokens, sorted by expert), combine one; the
backward pass sends the output gradients the same way and the input gradients
back (GShard, Lepikhin et al. 2020, section 2.2). There is no capacity limit:
every routed token reaches its expert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from testbed.collectives import Communicator
from testbed.train.step_context import StepContext
from workloads.blockspec import Arrays, gate_logits
from workloads.layers import gelu, layer_norm, layer_norm_backward, softmax


@dataclass
class Routing:
    """Where one micro-batch's token copies went: sorted by expert, then token, then slot."""

    token: np.ndarray  # token index of each routed copy
    expert: np.ndarray  # expert of each copy
    weight: np.ndarray  # gate probability of each copy
    send_counts: list[int]  # copies sent to each EP member
    recv_counts: list[np.ndarray]  # copies per local expert received from each member


def route(p: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top-``k`` experts per token by gate probability (ties to the lower expert); sorted copies."""
    top = np.argsort(-p, axis=1, kind="stable")[:, :k]
    expert = top.ravel()
    token = np.repeat(np.arange(p.shape[0]), k)
    order = np.argsort(expert, kind="stable")
    return token[order], expert[order], p[token[order], expert[order]]


def _alltoall(ctx: StepContext, group: Communicator, blocks: list[np.ndarray]) -> list[np.ndarray]:
    """The tokens' all-to-all, timed at the modelled job's size."""
    return group.alltoall(blocks, modelled=ctx.modelled("ep", sum(b.nbytes for b in blocks)))


def _split(rows: np.ndarray, counts: list[int]) -> list[np.ndarray]:
    return np.split(rows, np.cumsum(counts)[:-1].tolist()) if counts else [rows]


class MoEBlock:
    """One MoE block on one rank: the gate (replicated) and this rank's experts."""

    def __init__(self, index: int, options: dict[str, Any], ep_index: int, ep: int) -> None:
        self.i = index
        self.k = int(options["top_k"])
        self.experts = int(options["experts"])
        self.per = self.experts // ep
        self.first = ep_index * self.per
        self.d, self.fe = int(options["d_model"]), int(options["expert_ffn"])
        self.options = options

    def _name(self, e: int, part: str) -> str:
        return f"blk{self.i}.e{e}.{part}"

    def forward(self, ctx: StepContext, params: Arrays, x: np.ndarray) -> tuple[np.ndarray, Any]:
        """``x + MoE(LN(x))`` and the cache its backward needs."""
        i, group = self.i, ctx.groups["ep"]
        ctx.use("layer_norm", f"block {i} (moe)")
        hn, ln_cache = layer_norm(x, params[f"blk{i}.ln.g"], params[f"blk{i}.ln.b"])
        ctx.use("softmax", f"block {i} (moe gate)")
        p = softmax(gate_logits(hn, params[f"blk{i}.gate"], self.options))
        ctx.compute(2.0 * hn.shape[0] * self.d * self.experts)
        token, expert, weight = route(p, self.k)
        by_expert = np.bincount(expert, minlength=self.experts)
        send_counts = [int(by_expert[j * self.per : (j + 1) * self.per].sum()) for j in range(group.size)]
        ctx.use("alltoall", f"block {i} (moe dispatch)")
        per_member = [
            by_expert[j * self.per : (j + 1) * self.per].astype(np.int64) for j in range(group.size)
        ]
        recv_counts = group.alltoall(per_member)
        arrived = _alltoall(ctx, group, _split(hn[token], send_counts))
        inputs = self._by_expert(arrived, recv_counts)
        outs, caches = [], []
        for e, xe in enumerate(inputs):
            z = xe @ params[self._name(self.first + e, "w1")] + params[self._name(self.first + e, "b1")]
            a, da = gelu(z)
            outs.append(
                a @ params[self._name(self.first + e, "w2")] + params[self._name(self.first + e, "b2")]
            )
            caches.append((xe, a, da))
            ctx.compute(4.0 * xe.shape[0] * self.d * self.fe)
        back = _alltoall(ctx, group, self._by_member(outs, recv_counts))
        out_rows = np.concatenate(back) if back else np.zeros((0, self.d), np.float32)
        y = np.zeros_like(x)
        np.add.at(y, token, weight[:, None] * out_rows)
        routing = Routing(token, expert, weight, send_counts, recv_counts)
        return (x + y).astype(np.float32), (hn, ln_cache, p, routing, out_rows, caches)

    def backward(
        self, ctx: StepContext, params: Arrays, grads: Arrays, dy: np.ndarray, cache: Any
    ) -> np.ndarray:
        """Gradient with respect to the block's input; adds the parameters' gradients to ``grads``."""
        i, group = self.i, ctx.groups["ep"]
        hn, ln_cache, p, r, out_rows, caches = cache
        d_out = (r.weight[:, None] * dy[r.token]).astype(np.float32)
        d_weight = np.sum(dy[r.token] * out_rows, axis=1)
        arrived = _alltoall(ctx, group, _split(d_out, r.send_counts))
        d_outs = self._by_expert(arrived, r.recv_counts)
        d_inputs = []
        for e, (dz_out, (xe, a, da)) in enumerate(zip(d_outs, caches)):
            name = self.first + e
            grads[self._name(name, "b2")] += dz_out.sum(axis=0)
            grads[self._name(name, "w2")] += a.T @ dz_out
            dz = (dz_out @ params[self._name(name, "w2")].T) * da
            grads[self._name(name, "w1")] += xe.T @ dz
            grads[self._name(name, "b1")] += dz.sum(axis=0)
            d_inputs.append((dz @ params[self._name(name, "w1")].T).astype(np.float32))
            ctx.compute(8.0 * xe.shape[0] * self.d * self.fe)
        back = _alltoall(ctx, group, self._by_member(d_inputs, r.recv_counts))
        d_rows = np.concatenate(back) if back else np.zeros((0, self.d), np.float32)
        dhn = np.zeros_like(hn)
        np.add.at(dhn, r.token, d_rows)
        dp = np.zeros_like(p)
        dp[r.token, r.expert] = d_weight
        d_logits = (p * (dp - (p * dp).sum(axis=1, keepdims=True))).astype(np.float32)
        grads[f"blk{i}.gate"] += hn.T @ d_logits
        dhn += d_logits @ params[f"blk{i}.gate"].T
        ctx.compute(4.0 * hn.shape[0] * self.d * self.experts)
        dx, dg, db = layer_norm_backward(dhn, ln_cache)
        grads[f"blk{i}.ln.g"] += dg
        grads[f"blk{i}.ln.b"] += db
        return (dy + dx).astype(np.float32)

    def _by_expert(self, arrived: list[np.ndarray], recv_counts: list[np.ndarray]) -> list[np.ndarray]:
        """Rows from every member, regrouped per local expert (member order kept within an expert)."""
        pieces = [
            _split(rows.reshape(-1, self.d), [int(c) for c in counts])
            for rows, counts in zip(arrived, recv_counts)
        ]
        return [
            np.concatenate([pieces[m][e] for m in range(len(pieces))]).astype(np.float32)
            for e in range(self.per)
        ]

    def _by_member(self, per_expert: list[np.ndarray], recv_counts: list[np.ndarray]) -> list[np.ndarray]:
        """The inverse of :meth:`_by_expert`: rows per member, in the order that member sent them."""
        cut = [_split(rows, [int(counts[e]) for counts in recv_counts]) for e, rows in enumerate(per_expert)]
        return [
            np.concatenate([cut[e][m] for e in range(self.per)]).astype(np.float32)
            for m in range(len(recv_counts))
        ]
