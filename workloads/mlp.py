"""Data-parallel MLP regression: a small but complete training job.

A teacher MLP labels a seeded synthetic dataset; the student MLP (GeLU hidden
layers, dropout from a per-rank RNG) learns it with AdamW, a linear warm-up
then cosine learning rate, and gradient clipping by global norm. Each rank
reads its own shard of the data through a per-rank sampler whose cursor is
checkpointable state. Everything is float32 and deterministic.

Checkpointable components (all five of :data:`workloads.base.COMPONENTS`):

- ``params``: the weights; ``optimizer``: Adam moments and its step count;
- ``lr_scheduler``: the scheduler's position (kept apart from the global
  step, as the frameworks do: dropping it on resume restarts the warm-up);
- ``rng``: this rank's dropout generator; ``data_cursor``: epoch and position.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from testbed.core.seeding import stream
from testbed.topology.layout import Layout
from testbed.train.step_context import StepContext
from workloads import layers, option_docs
from workloads.base import (
    COMPONENTS,
    Arrays,
    Output,
    StepBuffers,
    WorkloadInfo,
    digest,
    moments_from,
    moments_state,
    register,
    unchanged,
)
from workloads.blockspec import load_rng_state, read_only, rng_state
from workloads.layers import gelu as _gelu

DEFAULTS: dict[str, Any] = {
    "layers": 2,
    "hidden": 64,
    "inputs": 16,
    "batch": 32,
    "samples": 4096,
    "lr": 3e-3,
    "min_lr": 3e-4,
    "warmup": 5,
    "weight_decay": 0.01,
    "dropout": 0.1,
    "clip": 1.0,
    "workspace_min_kib": 0,
    "workspace_max_kib": 0,
    "keep_kib": 0,
}


def _init_layers(rng: np.random.Generator, sizes: list[int]) -> Arrays:
    params: Arrays = {}
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        params[f"w{i}"] = (rng.standard_normal((fan_in, fan_out)) / math.sqrt(fan_in)).astype(np.float32)
        params[f"b{i}"] = np.zeros(fan_out, dtype=np.float32)
    return params


def make_dataset(seed: int, options: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The seeded dataset: inputs ``x`` and teacher targets ``y`` (same on every rank).

    Made once per process and read-only: the NPU host makes it before it forks, so every NPU
    process shares its pages and starts without making it again.
    """
    return _dataset(seed, int(options["samples"]), int(options["inputs"]), int(options["hidden"]))


@functools.lru_cache(maxsize=4)
def _dataset(seed: int, n: int, d: int, h: int) -> tuple[np.ndarray, np.ndarray]:
    x = stream(seed, "data", "x").standard_normal((n, d)).astype(np.float32)
    teacher = _init_layers(stream(seed, "data", "teacher"), [d, h, 1])
    y = np.tanh(x @ teacher["w0"]) @ teacher["w1"]
    noise = 0.01 * stream(seed, "data", "noise").standard_normal((n, 1))
    return read_only(x), read_only((y + noise).astype(np.float32))


def lr_at(position: int, total: int, options: Mapping[str, Any]) -> float:
    """Linear warm-up to ``lr`` over ``warmup`` steps, then cosine decay to ``min_lr`` at ``total``."""
    return layers.lr_at(
        position, total, float(options["lr"]), float(options["min_lr"]), int(options["warmup"])
    )


class MLPRegression:
    """One data-parallel rank of the MLP regression job."""

    components: tuple[str, ...] = COMPONENTS

    def __init__(self, options: Mapping[str, Any], seed: int, rank: int, layout: Layout) -> None:
        self.options = {**DEFAULTS, **options}
        world = layout.world
        self.seed, self.rank, self.world = seed, rank, world
        self.total_steps = int(self.options.get("steps", 100))
        self.x, self.y = make_dataset(seed, self.options)
        self.shard = np.arange(rank, len(self.x), world)
        sizes = (
            [int(self.options["inputs"])] + [int(self.options["hidden"])] * int(self.options["layers"]) + [1]
        )
        self.sizes = sizes
        self.params = _init_layers(stream(seed, "init"), sizes)
        self.m = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.v = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.adam_t = 0
        self.sched_pos = 0
        self.rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, rank, 0xD20])))
        self.epoch, self.cursor = 0, 0
        self._order = self._epoch_order()

    # --- data -----------------------------------------------------------
    def _epoch_order(self) -> np.ndarray:
        return stream(self.seed, "sampler", self.rank, self.epoch).permutation(self.shard)

    def _next_batch(self) -> np.ndarray:
        b = int(self.options["batch"])
        idx: list[int] = []
        while len(idx) < b:
            if self.cursor >= len(self._order):
                self.epoch, self.cursor = self.epoch + 1, 0
                self._order = self._epoch_order()
            take = min(b - len(idx), len(self._order) - self.cursor)
            idx.extend(self._order[self.cursor : self.cursor + take].tolist())
            self.cursor += take
        return np.asarray(idx)

    def skip_batches(self, n: int) -> None:
        """Throw away this rank's next ``n`` batches (a suspect stretch of data is skipped)."""
        for _ in range(n):
            self._next_batch()

    # --- compute --------------------------------------------------------
    def flops_per_step(self) -> float:
        """6 · batch · Σ fan_in·fan_out: 2 forward, 4 backward (Kaplan et al. 2020, eq. 2.1)."""
        macs = sum(a * b for a, b in itertools.pairwise(self.sizes))
        return 6.0 * int(self.options["batch"]) * macs

    def forward_backward(self, ctx: StepContext) -> tuple[float, Arrays, int]:
        """Local loss and gradients on this rank's next batch (no communication)."""
        for op in ("matmul", "gelu", "dropout"):
            ctx.use(op, "mlp layer 0")
        loss, grads, samples = self.local_step(ctx.output)
        total = self.flops_per_step()
        ctx.compute(total / 3)  # the forward pass: 2 of the 6 FLOPs per weight and sample
        ctx.enter("backward")
        ctx.compute(total - total / 3)
        return loss, grads, samples

    def local_step(self, output: Output | None = None) -> tuple[float, Arrays, int]:
        """Local loss and gradients on this rank's next batch (``output``: shown each value made, as
        :meth:`StepContext.output`)."""
        made: Output = output or unchanged
        idx = made("index", "samples", self._next_batch())
        x, y = self.x[idx], self.y[idx]
        p, keep = float(self.options["dropout"]), 1.0 - float(self.options["dropout"])
        n_hidden = len(self.sizes) - 2
        acts, grads_act, masks = [x], [], []
        h = x
        for i in range(n_hidden):
            z = h @ self.params[f"w{i}"] + self.params[f"b{i}"]
            a, da = _gelu(z)
            mask = (self.rng.random(a.shape) >= p).astype(np.float32) / np.float32(keep)
            h = made("forward", f"layer {i}", a * mask)
            acts.append(h)
            grads_act.append(da)
            masks.append(mask)
        out = h @ self.params[f"w{n_hidden}"] + self.params[f"b{n_hidden}"]
        diff = out - y
        loss = float(np.mean(diff**2))
        g = (2.0 / diff.size) * diff
        grads: Arrays = {}
        for i in range(n_hidden, -1, -1):
            grads[f"w{i}"] = (acts[i].T @ g).astype(np.float32)
            grads[f"b{i}"] = g.sum(axis=0).astype(np.float32)
            if i > 0:
                g = made(
                    "backward",
                    f"layer {i - 1}",
                    (g @ self.params[f"w{i}"].T) * masks[i - 1] * grads_act[i - 1],
                )
        return loss, grads, len(idx)

    def sync_plan(self) -> dict[str, int]:
        """One gradient allreduce per step over the data-parallel (``replica``) group."""
        return {"replica": sum(v.nbytes for v in self.params.values())}

    def sync_grads(self, ctx: StepContext, grads: Arrays) -> Arrays:
        """Average the gradients over every rank: one allreduce of all of them, flattened."""
        names = sorted(grads)
        flat = np.concatenate([grads[k].ravel() for k in names])
        avg = ctx.groups["replica"].allreduce(
            flat, op="avg", algo=ctx.algo("replica"), modelled=ctx.modelled("replica", flat.nbytes)
        )
        out, offset = {}, 0
        for k in names:
            out[k] = avg[offset : offset + grads[k].size].reshape(grads[k].shape)
            offset += grads[k].size
        return out

    def apply(self, ctx: StepContext | None, grads: Arrays) -> float:
        """AdamW step with global-norm clipping (the gradients are the same on every rank)."""
        sumsq = sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values())
        scale = layers.clip_scale(sumsq, float(self.options["clip"]))
        lr = lr_at(self.sched_pos, self.total_steps, self.options)
        self.adam_t += 1
        wd = float(self.options["weight_decay"])
        for k, w in self.params.items():
            self.params[k], self.m[k], self.v[k] = layers.adamw(
                w, grads[k] * scale, self.m[k], self.v[k], self.adam_t, lr, wd
            )
        self.sched_pos += 1
        return lr

    # --- state ----------------------------------------------------------
    def state(self, component: str) -> Arrays:
        """The arrays of ``component`` (one of :data:`COMPONENTS`)."""
        if component == "params":
            return {k: v.copy() for k, v in self.params.items()}
        if component == "optimizer":
            return moments_state(self.m, self.v, self.adam_t)
        if component == "lr_scheduler":
            return {"position": np.asarray(self.sched_pos, dtype=np.int64)}
        if component == "rng":
            return rng_state(self.rng)
        if component == "data_cursor":
            return {"epoch_cursor": np.asarray([self.epoch, self.cursor], dtype=np.int64)}
        raise KeyError(component)

    def load(self, component: str, arrays: Mapping[str, np.ndarray]) -> None:
        """Restore ``component`` from arrays written by :meth:`state`."""
        if component == "params":
            self.params = {k: np.array(arrays[k], dtype=np.float32) for k in self.params}
        elif component == "optimizer":
            self.m, self.v, self.adam_t = moments_from(arrays, self.params)
        elif component == "lr_scheduler":
            self.sched_pos = int(arrays["position"])
        elif component == "rng":
            load_rng_state(self.rng, arrays)
        elif component == "data_cursor":
            self.epoch, self.cursor = (int(v) for v in arrays["epoch_cursor"])
            self._order = self._epoch_order()
        else:
            raise KeyError(component)

    def persistent_bytes(self) -> dict[str, int]:
        """Parameters and both Adam moments."""
        nbytes = sum(v.nbytes for v in self.params.values())
        return {"params": nbytes, "adam_m": nbytes, "adam_v": nbytes}

    def step_bytes(self, step: int) -> StepBuffers:
        """Activations and gradients from the shapes; a workspace whose size varies per step.

        The workspace size is drawn per rank and step from the seed, between
        ``workspace_min_kib`` and a ceiling that climbs to ``workspace_max_kib``
        by the last step (attention workspaces follow the sequence length, and a
        length curriculum grows it); ``keep_kib`` is left behind by every step.
        """
        lo, hi = int(self.options["workspace_min_kib"]), int(self.options["workspace_max_kib"])
        top = lo + (max(lo, hi) - lo) * min(1.0, step / max(1, self.total_steps))
        workspace = int(stream(self.seed, "workspace", self.rank, step).uniform(lo, top) * 1024)
        batch, hidden, layers = (int(self.options[k]) for k in ("batch", "hidden", "layers"))
        grads = sum(v.nbytes for v in self.params.values())
        return StepBuffers(
            workspace=workspace,
            activations=2 * 4 * batch * hidden * layers,
            keep=int(self.options["keep_kib"]) * 1024,
            grads=grads,
            comm=grads,
        )

    def params_digest(self) -> str:
        """sha256 over the parameters in name order."""
        return digest(self.params)


def validate(options: Mapping[str, Any], layout: Layout) -> list[str]:
    """The MLP is data-parallel only."""
    if layout.world == layout.dp:
        return []
    return [
        f"the mlp is data-parallel only (got tp {layout.tp}, pp {layout.pp}, ep {layout.ep}); set them to 1, "
        "or use workload 'transformer' for tensor, pipeline and expert parallelism"
    ]


def host_bytes(options: Mapping[str, Any], layout: Layout) -> int:
    """What one rank's process holds, from the shapes: the data set while it is made (inputs, the
    teacher's hidden activations twice, targets, noise), the shard's sampler order, and the
    parameters with Adam's two moments, the gradients and the update's temporaries (8 copies)."""
    o = {**DEFAULTS, **options}
    n, d, h, layers = int(o["samples"]), int(o["inputs"]), int(o["hidden"]), int(o["layers"])
    params = d * h + h + max(0, layers - 1) * (h * h + h) + h + 1
    data = n * (d + 2 * h + 6) * 4
    sampler = 16 * -(-n // max(1, layout.world))
    activations = 8 * int(o["batch"]) * (d + h * layers) * 4
    return data + sampler + 8 * params * 4 + activations


INFO = register(
    WorkloadInfo(
        name="mlp",
        description="data-parallel MLP regression (AdamW, warm-up + cosine LR, dropout, per-rank sampler)",
        factory=MLPRegression,
        options=DEFAULTS,
        option_docs=option_docs.MLP,
        validate=validate,
        host_bytes=host_bytes,
    )
)
