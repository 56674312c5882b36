"""Numpy building blocks shared by the workloads and their single-process references.

Only elementwise and per-row pieces live here (activation, normalisation,
dropout masks, softmax, the optimizer update): each is the same function
wherever the row or column lands, so a model cut across ranks and the same
model in one process compute identical values from them. How layers are cut
and composed is each model's own code, written twice (distributed and
reference) on purpose.
"""

from __future__ import annotations

import math

import numpy as np

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
LN_EPS = 1e-5


def gelu(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GeLU (tanh approximation, Hendrycks & Gimpel 2016) and its derivative, in ``z``'s precision."""
    z2 = z * z
    t = np.tanh(_SQRT_2_OVER_PI * (z + 0.044715 * z2 * z))
    half_1pt = 0.5 * (1.0 + t)
    out = z * half_1pt
    grad = half_1pt + 0.5 * z * (1.0 - t * t) * (_SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * z2))
    return out.astype(np.float32, copy=False), grad.astype(np.float32, copy=False)


def layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """Layer norm over the last axis (Ba, Kiros & Hinton 2016); returns the output and its cache."""
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    rstd = (1.0 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + LN_EPS)).astype(np.float32)
    xhat = xc * rstd
    return (xhat * g + b).astype(np.float32), (xhat, rstd, g)


def layer_norm_backward(dy: np.ndarray, cache: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Gradients (dx, dg, db) of :func:`layer_norm`."""
    xhat, rstd, g = cache
    dg = (dy * xhat).sum(axis=0)
    db = dy.sum(axis=0)
    dxhat = dy * g
    n = xhat.shape[-1]
    dx = rstd * (
        dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).sum(-1, keepdims=True) / n
    )
    return dx.astype(np.float32), dg.astype(np.float32), db.astype(np.float32)


def dropout_mask(key: int, layer: int, rows: np.ndarray, cols: np.ndarray, p: float) -> np.ndarray:
    """A counter-based dropout mask, scaled by ``1/(1-p)``: element (row, col) depends only on its ids.

    ``rows`` are the samples' dataset indices and ``cols`` the features' global
    indices, so any cut of the tensor across ranks draws the same mask as the
    whole tensor in one process (the property counter-based generators such as
    Philox give, Salmon et al. SC 2011). The mixer is splitmix64's finaliser
    (Steele, Lea & Flood, OOPSLA 2014).
    """
    if p <= 0.0:
        return np.ones((len(rows), len(cols)), dtype=np.float32)
    with np.errstate(over="ignore"):
        x = (
            np.uint64(key)
            ^ (rows.astype(np.uint64)[:, None] * np.uint64(0x9E3779B97F4A7C15))
            ^ (cols.astype(np.uint64)[None, :] * np.uint64(0xC2B2AE3D27D4EB4F))
            ^ (np.uint64(layer + 1) * np.uint64(0x165667B19E3779F9))
        )
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    u = (x >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return ((u >= p).astype(np.float32) / np.float32(1.0 - p)).astype(np.float32)


def softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax, stabilised by the row maximum."""
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def lr_at(position: int, total: int, lr: float, min_lr: float, warmup: int) -> float:
    """Linear warm-up to ``lr`` over ``warmup`` steps, then cosine decay to ``min_lr`` at ``total``."""
    if position < warmup:
        return lr * (position + 1) / warmup
    progress = min(1.0, (position - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def clip_scale(sumsq: float, clip: float) -> np.float32:
    """Gradient scale for clipping by global norm ``sqrt(sumsq)`` to ``clip`` (Pascanu et al. 2013)."""
    return np.float32(min(1.0, clip / (math.sqrt(sumsq) + 1e-6)))


def adamw(
    w: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, t: int, lr: float, wd: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One AdamW update (Loshchilov & Hutter 2019; β=0.9, 0.999, ε=1e-8), in place; returns (w, m, v).

    ``w``, ``m`` and ``v`` are float32 arrays this call may overwrite.
    """
    b1, b2, eps = 0.9, 0.999, 1e-8
    c1, c2 = 1.0 - b1**t, 1.0 - b2**t
    m *= b1
    m += (1 - b1) * g
    v *= b2
    g2 = (1 - b2) * g
    g2 *= g
    v += g2
    denom = v / c2
    np.sqrt(denom, out=denom)
    denom += eps
    step = m / c1
    step /= denom
    step += wd * w
    step *= np.float32(lr)
    w -= step
    return w, m, v
