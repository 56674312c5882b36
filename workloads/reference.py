"""The single-process reference of the transformer-like model: no cuts, no messages, the whole batch at once.

Written apart from :mod:`workloads.transformer` on purpose: it shares the
model's definition (:mod:`workloads.blockspec`) and the per-element pieces
(:mod:`workloads.layers`), but computes every block on full matrices, routes
MoE tokens expert by expert in one place, and takes the loss over the whole
global batch. A distributed run that matches it has cut nothing wrongly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from workloads.blockspec import (
    Arrays,
    Sampler,
    block_kinds,
    dropout_generator,
    gate_logits,
    init_params,
    make_dataset,
    options_of,
)
from workloads.layers import (
    adamw,
    clip_scale,
    dropout_mask,
    gelu,
    layer_norm,
    layer_norm_backward,
    lr_at,
    softmax,
)


class Reference:
    """The whole model in one process; :meth:`step` trains one step and returns its loss."""

    def __init__(self, options: Mapping[str, Any], seed: int) -> None:
        self.o = options_of(options)
        self.total_steps = int(self.o.get("steps", 100))
        self.x, self.y = make_dataset(seed, self.o)
        self.params = init_params(seed, self.o)
        self.m = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.v = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.t = 0
        self.rng = dropout_generator(seed)
        self.sampler = Sampler(seed, int(self.o["samples"]))
        self.kinds = block_kinds(self.o)
        self.last_grads: Arrays = {}

    def step(self) -> float:
        """One training step on the global batch; returns the mean squared error before the update."""
        key = int(self.rng.integers(0, 2**63))
        idx = self.sampler.next(int(self.o["batch"]))
        loss, grads = self.loss_and_grads(self.x[idx], self.y[idx], key)
        self.last_grads = grads
        self._update(grads)
        return loss

    def loss_and_grads(self, x: np.ndarray, y: np.ndarray, key: int) -> tuple[float, Arrays]:
        """Loss and gradients of the whole batch."""
        p = self.params
        rows = np.arange(x.shape[0])
        h = (x @ p["embed.w"] + p["embed.b"]).astype(np.float32)
        caches = []
        for i, kind in enumerate(self.kinds):
            block = self._dense if kind == "dense" else self._moe
            h, cache = block(i, h, rows, key)
            caches.append(cache)
        out = h @ p["head.w"] + p["head.b"]
        diff = out - y
        grads = {k: np.zeros_like(v) for k, v in p.items()}
        d_out = (2.0 / diff.size * diff).astype(np.float32)
        grads["head.w"], grads["head.b"] = h.T @ d_out, d_out.sum(axis=0)
        dh = d_out @ p["head.w"].T
        for i in reversed(range(len(self.kinds))):
            back = self._dense_back if self.kinds[i] == "dense" else self._moe_back
            dh = back(i, dh, caches[i], grads)
        grads["embed.w"], grads["embed.b"] = x.T @ dh, dh.sum(axis=0)
        return float(np.mean(diff**2)), grads

    def _dense(self, i: int, x: np.ndarray, rows: np.ndarray, key: int) -> tuple[np.ndarray, Any]:
        p = self.params
        hn, ln = layer_norm(x, p[f"blk{i}.ln.g"], p[f"blk{i}.ln.b"])
        a, da = gelu(hn @ p[f"blk{i}.w1"] + p[f"blk{i}.b1"])
        mask = dropout_mask(key, i, rows, np.arange(a.shape[1]), float(self.o["dropout"]))
        a = a * mask
        return (x + a @ p[f"blk{i}.w2"] + p[f"blk{i}.b2"]).astype(np.float32), (hn, ln, a, da * mask)

    def _dense_back(self, i: int, dy: np.ndarray, cache: Any, grads: Arrays) -> np.ndarray:
        p = self.params
        hn, ln, a, dmask = cache
        grads[f"blk{i}.b2"], grads[f"blk{i}.w2"] = dy.sum(axis=0), a.T @ dy
        dz = (dy @ p[f"blk{i}.w2"].T) * dmask
        grads[f"blk{i}.w1"], grads[f"blk{i}.b1"] = hn.T @ dz, dz.sum(axis=0)
        dx, grads[f"blk{i}.ln.g"], grads[f"blk{i}.ln.b"] = layer_norm_backward(dz @ p[f"blk{i}.w1"].T, ln)
        return (dy + dx).astype(np.float32)

    def _moe(self, i: int, x: np.ndarray, rows: np.ndarray, key: int) -> tuple[np.ndarray, Any]:
        p, k = self.params, int(self.o["top_k"])
        hn, ln = layer_norm(x, p[f"blk{i}.ln.g"], p[f"blk{i}.ln.b"])
        probs = softmax(gate_logits(hn, p[f"blk{i}.gate"], self.o))
        top = np.argsort(-probs, axis=1, kind="stable")[:, :k]
        y = np.zeros_like(x)
        experts: dict[int, tuple[np.ndarray, ...]] = {}
        for e in range(int(self.o["experts"])):
            tokens = np.nonzero((top == e).any(axis=1))[0]
            a, da = gelu(hn[tokens] @ p[f"blk{i}.e{e}.w1"] + p[f"blk{i}.e{e}.b1"])
            out = a @ p[f"blk{i}.e{e}.w2"] + p[f"blk{i}.e{e}.b2"]
            y[tokens] += probs[tokens, e][:, None] * out
            experts[e] = (tokens, a, da, out)
        return (x + y).astype(np.float32), (hn, ln, probs, experts)

    def _moe_back(self, i: int, dy: np.ndarray, cache: Any, grads: Arrays) -> np.ndarray:
        p = self.params
        hn, ln, probs, experts = cache
        dhn = np.zeros_like(hn)
        dprob = np.zeros_like(probs)
        for e, (tokens, a, da, out) in experts.items():
            dprob[tokens, e] = np.sum(dy[tokens] * out, axis=1)
            d_out = probs[tokens, e][:, None] * dy[tokens]
            grads[f"blk{i}.e{e}.b2"], grads[f"blk{i}.e{e}.w2"] = d_out.sum(axis=0), a.T @ d_out
            dz = (d_out @ p[f"blk{i}.e{e}.w2"].T) * da
            grads[f"blk{i}.e{e}.w1"], grads[f"blk{i}.e{e}.b1"] = hn[tokens].T @ dz, dz.sum(axis=0)
            dhn[tokens] += dz @ p[f"blk{i}.e{e}.w1"].T
        d_logits = probs * (dprob - (probs * dprob).sum(axis=1, keepdims=True))
        grads[f"blk{i}.gate"] = hn.T @ d_logits
        dhn += d_logits @ p[f"blk{i}.gate"].T
        dx, grads[f"blk{i}.ln.g"], grads[f"blk{i}.ln.b"] = layer_norm_backward(dhn.astype(np.float32), ln)
        return (dy + dx).astype(np.float32)

    def _update(self, grads: Arrays) -> None:
        o = self.o
        sumsq = math.fsum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values())
        scale = clip_scale(sumsq, float(o["clip"]))
        lr = lr_at(self.t, self.total_steps, float(o["lr"]), float(o["min_lr"]), int(o["warmup"]))
        self.t += 1
        for k in sorted(self.params):
            g = (grads[k] * scale).astype(np.float32)
            self.params[k], self.m[k], self.v[k] = adamw(
                self.params[k], g, self.m[k], self.v[k], self.t, lr, float(o["weight_decay"])
            )
