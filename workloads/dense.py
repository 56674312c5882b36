"""A dense transformer-like block cut by tensor parallelism (Megatron-LM, Shoeybi et al. 2019, section 3):
``W1`` by columns, ``W2`` by rows, one allreduce after ``W2`` forward and one after ``W1``'s input
gradient backward."""

from __future__ import annotations

from typing import Any

import numpy as np

from testbed.train.step_context import StepContext
from workloads.blockspec import Arrays
from workloads.layers import dropout_mask, gelu, layer_norm, layer_norm_backward


class DenseBlock:
    """A dense block's slice on one TP rank: column-parallel ``W1``, row-parallel ``W2``."""

    def __init__(self, index: int, cols: np.ndarray, dropout: float) -> None:
        self.i, self.cols, self.p = index, cols, dropout

    def forward(
        self, ctx: StepContext, params: Arrays, x: np.ndarray, rows: np.ndarray, key: int
    ) -> tuple[np.ndarray, Any]:
        """``x + W2·dropout(GeLU(W1·LN(x) + b1)) + b2`` and the backward's cache."""
        i, tp = self.i, ctx.groups["tp"]
        ctx.use("layer_norm", f"block {i}")
        hn, ln_cache = layer_norm(x, params[f"blk{i}.ln.g"], params[f"blk{i}.ln.b"])
        ctx.use("gelu", f"block {i}")
        a, da = gelu(hn @ params[f"blk{i}.w1"] + params[f"blk{i}.b1"])
        if self.p > 0:
            ctx.use("dropout", f"block {i}")
        mask = dropout_mask(key, i, rows, self.cols, self.p)
        a = a * mask
        o = a @ params[f"blk{i}.w2"]
        ctx.compute(4.0 * x.shape[0] * x.shape[1] * len(self.cols))
        if tp.size > 1:
            o = tp.allreduce(o, modelled=ctx.modelled("tp", o.nbytes))
        return (x + o + params[f"blk{i}.b2"]).astype(np.float32), (hn, ln_cache, a, da * mask)

    def backward(
        self, ctx: StepContext, params: Arrays, grads: Arrays, dy: np.ndarray, cache: Any
    ) -> np.ndarray:
        """Input gradient; the parameters' gradients are added to ``grads``."""
        i, tp = self.i, ctx.groups["tp"]
        hn, ln_cache, a, dmask = cache
        grads[f"blk{i}.b2"] += dy.sum(axis=0)
        grads[f"blk{i}.w2"] += a.T @ dy
        dz = (dy @ params[f"blk{i}.w2"].T) * dmask
        grads[f"blk{i}.w1"] += hn.T @ dz
        grads[f"blk{i}.b1"] += dz.sum(axis=0)
        dhn = dz @ params[f"blk{i}.w1"].T
        ctx.compute(8.0 * dy.shape[0] * dy.shape[1] * len(self.cols))
        if tp.size > 1:
            dhn = tp.allreduce(dhn, modelled=ctx.modelled("tp", dhn.nbytes))
        dx, dg, db = layer_norm_backward(dhn, ln_cache)
        grads[f"blk{i}.ln.g"] += dg
        grads[f"blk{i}.ln.b"] += db
        return (dy + dx).astype(np.float32)
