"""A transformer-like block stack (and MoE blocks) cut by data, tensor, pipeline and expert parallelism.

The model is :mod:`workloads.blockspec`'s. On a rank of a ``dp x tp x pp x ep``
layout (:mod:`testbed.topology.layout`):

- TP (Megatron-LM, Shoeybi et al. 2019, section 3): a dense block's ``W1`` is
  cut by columns and ``W2`` by rows; one allreduce after ``W2`` in the
  forward pass and one after ``W1``'s input gradient in the backward pass.
- PP: each stage holds a contiguous run of blocks; the step's micro-batches
  run on the 1F1B schedule (PipeDream-Flush, Narayanan et al. 2021) over
  send/recv; waits on those receives are the pipeline bubble.
- EP: each MoE block's experts are spread over the EP group (:mod:`workloads.moe`).
- DP: each of the ``dp x ep`` replicas reads its slice of the global batch;
  gradients are summed over their replica group (dense) or DP group
  (experts), then divided by the replica count; then a global-norm clip
  (an allreduce over the model-parallel ranks) and AdamW. With ``zero: 1``
  the sum is a reduce-scatter, each rank updates its shard with its shard of
  the Adam moments, and an allgather returns the parameters
  (:mod:`workloads.zero`).

Dropout masks are counter-based over global ids (sample position in the
global batch, feature index), keyed once per step from a generator every rank
keeps, so every cut draws the mask the single-process reference draws.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from testbed.topology.layout import Layout
from testbed.train.step_context import StepContext
from workloads import option_docs
from workloads.base import (
    COMPONENTS,
    StepBuffers,
    WorkloadInfo,
    digest,
    moments_from,
    moments_state,
    register,
)
from workloads.blockspec import (
    DEFAULTS,
    Arrays,
    Sampler,
    block_kinds,
    counted_in_norm,
    cuts_of,
    dropout_generator,
    host_bytes,
    init_params,
    is_expert,
    load_rng_state,
    make_dataset,
    options_of,
    rng_state,
    stage_blocks,
    validate,
)
from workloads.dense import DenseBlock
from workloads.layers import adamw, clip_scale, lr_at
from workloads.moe import MoEBlock
from workloads.zero import ShardedState


def one_f_one_b(stage: int, stages: int, micro: int) -> list[tuple[str, int]]:
    """The 1F1B order of forward (``F``) and backward (``B``) passes of one stage's micro-batches."""
    warm = min(stages - stage - 1, micro)
    ops = [("F", i) for i in range(warm)]
    for i in range(micro - warm):
        ops += [("F", warm + i), ("B", i)]
    return ops + [("B", i) for i in range(micro - warm, micro)]


class TransformerRank:
    """One rank of the parallel transformer-like job."""

    components: tuple[str, ...] = COMPONENTS

    def __init__(self, options: Mapping[str, Any], seed: int, rank: int, layout: Layout) -> None:
        self.o = options_of(options)
        self.seed, self.rank, self.layout = seed, rank, layout
        self.c = layout.coords(rank)
        self.total_steps = int(self.o.get("steps", 100))
        self.x, self.y = make_dataset(seed, self.o)
        self.cuts = cuts_of(self.o, layout, self.c)
        full = init_params(seed, self.o)
        self.params = {k: cut.take(full[k]) for k, cut in self.cuts.items()}
        self.m = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.v = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.adam_t, self.sched_pos = 0, 0
        self.rng = dropout_generator(seed)
        self.sampler = Sampler(seed, int(self.o["samples"]))
        self.blocks = self._blocks()
        self.first, self.last = self.c.pp == 0, self.c.pp == layout.pp - 1
        self.sync_names = {
            "replica": [k for k in sorted(self.params) if not is_expert(k)],
            "dp": [k for k in sorted(self.params) if is_expert(k)],
        }
        self.sharded: dict[str, ShardedState] = {}
        if int(self.o["zero"]):  # the moments live in the shards instead
            self.m, self.v = {}, {}
            for group, names in self.sync_names.items():
                axes = ("dp", "ep") if group == "replica" else ("dp",)
                members = layout.group(rank, axes)
                if names:
                    self.sharded[group] = ShardedState(names, self.params, len(members), members.index(rank))

    def _blocks(self) -> list[Any]:
        f, tp = int(self.o["ffn"]), self.layout.tp
        cols = np.arange(self.c.tp * f // tp, (self.c.tp + 1) * f // tp)
        kinds = block_kinds(self.o)
        return [
            DenseBlock(i, cols, float(self.o["dropout"]))
            if kinds[i] == "dense"
            else MoEBlock(i, self.o, self.c.ep, self.layout.ep)
            for i in stage_blocks(self.o, self.layout.pp)[self.c.pp]
        ]

    # --- the step ------------------------------------------------------------
    def _micro_batches(self, ctx: StepContext) -> list[tuple[np.ndarray, np.ndarray]]:
        """(dataset indices, positions in the global batch) of this replica's micro-batches."""
        batch, m = int(self.o["batch"]), int(self.o["micro_batches"])
        idx = self.sampler.next(batch)
        local = batch // self.layout.replicas
        replica = self.c.dp * self.layout.ep + self.c.ep
        pos = np.arange(replica * local, (replica + 1) * local)
        return list(zip(np.split(ctx.output("index", "samples", idx[pos]), m), np.split(pos, m)))

    def skip_batches(self, n: int) -> None:
        """Throw away the next ``n`` global batches (a suspect stretch of data is skipped)."""
        for _ in range(n):
            self.sampler.next(int(self.o["batch"]))

    def forward_backward(self, ctx: StepContext) -> tuple[float | None, Arrays, int]:
        """This stage's share of the step on its micro-batches (1F1B); returns (loss, grads, samples)."""
        key = int(self.rng.integers(0, 2**63))
        mbs = self._micro_batches(ctx)
        grads = {k: np.zeros_like(v) for k, v in self.params.items()}
        caches: dict[int, Any] = {}
        losses: list[float] = []
        for kind, i in one_f_one_b(self.c.pp, self.layout.pp, len(mbs)):
            if kind == "F":
                caches[i] = self._forward(ctx, mbs[i], key, losses)
            else:
                if i == 0:  # micro-batch 0's is this stage's first backward pass
                    ctx.enter("backward")
                self._backward(ctx, caches.pop(i), grads)
        loss = float(np.mean(losses)) if self.last else None
        return loss, grads, sum(len(idx) for idx, _ in mbs)

    def _forward(
        self, ctx: StepContext, mb: tuple[np.ndarray, np.ndarray], key: int, losses: list[float]
    ) -> Any:
        idx, pos = mb
        pp = ctx.groups["pp"]
        if self.first:
            ctx.use("matmul", "embed")
            x = self.x[idx]
            h = (x @ self.params["embed.w"] + self.params["embed.b"]).astype(np.float32)
            ctx.compute(2.0 * x.shape[0] * x.shape[1] * h.shape[1])
        else:
            x = None
            h = ctx.recv("pp", pp.ranks[self.c.pp - 1])
        caches = []
        for block in self.blocks:
            args = (pos, key) if isinstance(block, DenseBlock) else ()
            h, cache = block.forward(ctx, self.params, h, *args)
            h = ctx.output("forward", f"block {block.i}", h)
            caches.append(cache)
        if not self.last:
            ctx.send("pp", pp.ranks[self.c.pp + 1], h)
            return x, caches, None, None
        out = h @ self.params["head.w"] + self.params["head.b"]
        ctx.compute(2.0 * h.shape[0] * h.shape[1] * out.shape[1])
        diff = out - self.y[idx]
        losses.append(float(np.mean(diff**2)))
        d_out = (2.0 / (diff.size * int(self.o["micro_batches"])) * diff).astype(np.float32)
        return x, caches, h, d_out

    def _backward(self, ctx: StepContext, cache: Any, grads: Arrays) -> None:
        x, caches, h, d_out = cache
        pp = ctx.groups["pp"]
        if self.last:
            grads["head.w"] += h.T @ d_out
            grads["head.b"] += d_out.sum(axis=0)
            dh = (d_out @ self.params["head.w"].T).astype(np.float32)
            ctx.compute(4.0 * h.shape[0] * h.shape[1] * d_out.shape[1])
        else:
            dh = ctx.recv("pp", pp.ranks[self.c.pp + 1])
        for block, block_cache in zip(reversed(self.blocks), reversed(caches)):
            dh = ctx.output(
                "backward", f"block {block.i}", block.backward(ctx, self.params, grads, dh, block_cache)
            )
        if self.first:
            grads["embed.w"] += x.T @ dh
            grads["embed.b"] += dh.sum(axis=0)
            ctx.compute(2.0 * x.shape[0] * x.shape[1] * dh.shape[1])
        else:
            ctx.send("pp", pp.ranks[self.c.pp - 1], dh)

    def sync_plan(self) -> dict[str, int]:
        """Dense gradients over ``replica``, expert gradients over ``dp`` (groups with nothing left out)."""
        plan = {
            "replica": sum(v.nbytes for k, v in self.params.items() if not is_expert(k)),
            "dp": sum(v.nbytes for k, v in self.params.items() if is_expert(k)),
        }
        return {k: v for k, v in plan.items() if v}

    def sync_grads(self, ctx: StepContext, grads: Arrays) -> Arrays:
        """Average the gradients over the replicas: dense over ``replica``, experts over ``dp``.

        With ``zero: 1`` a reduce-scatter: the result is this rank's shard of
        each group's flat gradient, under the key ``@group``.
        """
        if self.sharded:
            return self._reduce_scatter(ctx, grads)
        out: Arrays = {}
        scale = self._grad_scale(ctx)
        for group, names in self.sync_names.items():
            if not names:
                continue
            flat = np.concatenate([grads[k].ravel() for k in names])
            comm = ctx.groups[group]
            sized, algo = ctx.modelled(group, flat.nbytes), ctx.algo(group)
            summed = comm.allreduce(flat, op="sum", algo=algo, modelled=sized) if comm.size > 1 else flat
            summed = summed * scale
            offset = 0
            for k in names:
                out[k] = summed[offset : offset + grads[k].size].reshape(grads[k].shape)
                offset += grads[k].size
        return out

    def _grad_scale(self, ctx: StepContext) -> np.float32:
        """1 / the replicas training now (``dp x ep``; fewer while an elastic job has dropped some)."""
        return np.float32(1.0 / (ctx.groups["dp"].size * self.layout.ep))

    def _reduce_scatter(self, ctx: StepContext, grads: Arrays) -> Arrays:
        out: Arrays = {}
        for group, state in self.sharded.items():
            comm = ctx.groups[group]
            flat = state.flatten(grads, comm.size)
            sized = ctx.modelled(group, flat.nbytes)
            shard = comm.reduce_scatter(flat, op="sum", modelled=sized) if comm.size > 1 else flat
            out[f"@{group}"] = shard * self._grad_scale(ctx)
        return out

    def _apply_sharded(self, ctx: StepContext, shards: Arrays, lr: float) -> None:
        """Clip by the norm over every shard (an allreduce over all ranks), AdamW on the shard, allgather."""
        local = 0.0
        for group, state in self.sharded.items():
            counted = {k: self.cuts[k].axis is not None or self.c.tp == 0 for k in state.names}
            g = shards[f"@{group}"].astype(np.float64)
            local += float(np.sum((g * g)[state.mask(counted, ctx.groups[group].size)]))
        world = ctx.groups["world"]
        total = np.asarray([local], dtype=np.float64)
        scale = clip_scale(
            float(world.allreduce(total)[0]) if world.size > 1 else local, float(self.o["clip"])
        )
        for group, state in self.sharded.items():
            comm = ctx.groups[group]
            flat = state.flatten(self.params, comm.size)
            mine = flat[state.lo : state.lo + state.per].copy()
            mine, state.m, state.v = adamw(
                mine,
                shards[f"@{group}"] * scale,
                state.m,
                state.v,
                self.adam_t,
                lr,
                float(self.o["weight_decay"]),
            )
            if comm.size > 1:  # the parameters back, as many bytes as the gradients went out
                mine = comm.allgather(mine, modelled=ctx.modelled(group, flat.nbytes))
            self.params.update(state.unflatten(mine))

    def apply(self, ctx: StepContext, grads: Arrays) -> float:
        """Clip by the global norm (an allreduce over the model-parallel ranks), then AdamW."""
        if self.sharded:
            o = self.o
            lr = lr_at(self.sched_pos, self.total_steps, float(o["lr"]), float(o["min_lr"]), int(o["warmup"]))
            self.adam_t += 1
            self._apply_sharded(ctx, grads, lr)
            self.sched_pos += 1
            return lr
        local = math.fsum(
            float(np.sum(grads[k].astype(np.float64) ** 2))
            for k in sorted(grads)
            if counted_in_norm(k, self.cuts[k], self.c)
        )
        model = ctx.groups["model"]
        total = np.asarray([local], dtype=np.float64)
        sumsq = float(model.allreduce(total)[0]) if model.size > 1 else local
        scale = clip_scale(sumsq, float(self.o["clip"]))
        o = self.o
        lr = lr_at(self.sched_pos, self.total_steps, float(o["lr"]), float(o["min_lr"]), int(o["warmup"]))
        self.adam_t += 1
        wd = float(o["weight_decay"])
        for k in sorted(self.params):
            self.params[k], self.m[k], self.v[k] = adamw(
                self.params[k], grads[k] * scale, self.m[k], self.v[k], self.adam_t, lr, wd
            )
        self.sched_pos += 1
        return lr

    # --- accounting ------------------------------------------------------------
    def flops_per_step(self) -> float:
        """Matmul FLOPs of one step on this rank from the shapes (experts at an even routing)."""
        o, lay = self.o, self.layout
        rows = int(o["batch"]) // lay.replicas
        d = int(o["d_model"])
        total = 0.0
        for block in self.blocks:
            if isinstance(block, DenseBlock):
                total += 12.0 * rows * d * len(block.cols)
            else:
                routed = rows * block.k * lay.ep * block.per / block.experts
                total += 6.0 * rows * d * block.experts + 12.0 * routed * d * block.fe
        if self.first:
            total += 4.0 * rows * int(o["inputs"]) * d
        if self.last:
            total += 6.0 * rows * d * int(o["outputs"])
        return total

    def traffic(self) -> dict[str, tuple[float, float]]:
        """(bytes, calls) this rank hands per step to its TP allreduces (one forward, one backward
        per dense block and micro-batch), PP sends (activations on, gradients back) and EP
        all-to-alls (dispatch and combine, both ways, at an even routing; the counts' exchange
        left out), over the step's micro-batches; with ``zero: 1``, to its gradient sync's
        reduce-scatter and allgather."""
        lay, d, m = self.layout, int(self.o["d_model"]), int(self.o["micro_batches"])
        act = 4.0 * int(self.o["batch"]) // lay.replicas * d  # float32 rows of the whole step
        dense = sum(1 for b in self.blocks if isinstance(b, DenseBlock))
        moe = [b for b in self.blocks if not isinstance(b, DenseBlock)]
        sends = (not self.first) + (not self.last)
        out = {
            "tp": (2 * dense * act, 2.0 * dense * m) if lay.tp > 1 else (0.0, 0.0),
            "pp": (act * sends, float(m * sends)),
            "ep": (sum(4 * b.k * act for b in moe), 4.0 * len(moe) * m) if lay.ep > 1 else (0.0, 0.0),
        }
        # a sharded group's gradients go out in a reduce-scatter and the parameters come back in an
        # allgather of as many bytes: two calls that together stand for the job's one allreduce
        out.update({g: (2.0 * n, 2.0) for g, n in self.sync_plan().items() if g in self.sharded})
        return out

    def persistent_bytes(self) -> dict[str, int]:
        """This rank's parameters and both Adam moments (a shard of them with ``zero: 1``)."""
        nbytes = sum(v.nbytes for v in self.params.values())
        moments = sum(4 * st.per for st in self.sharded.values()) if self.sharded else nbytes
        return {"params": nbytes, "adam_m": moments, "adam_v": moments}

    def step_bytes(self, step: int) -> StepBuffers:
        """Activations of the micro-batches 1F1B keeps in flight on this stage; gradients; the flat buffer."""
        o, lay = self.o, self.layout
        mb = int(o["batch"]) // lay.replicas // int(o["micro_batches"])
        width = 3 * int(o["d_model"]) + 3 * int(o["ffn"]) // lay.tp
        in_flight = min(int(o["micro_batches"]), lay.pp - self.c.pp)
        grads = sum(v.nbytes for v in self.params.values())
        return StepBuffers(0, 4 * mb * width * len(self.blocks) * in_flight, 0, grads, grads)

    # --- state -----------------------------------------------------------------
    def state(self, component: str) -> Arrays:
        """The arrays of ``component`` (one of :data:`COMPONENTS`); parameters by their full names."""
        if component == "params":
            return {k: v.copy() for k, v in self.params.items()}
        if component == "optimizer":
            if self.sharded:  # this rank's shard of the moments only, under the group's name
                m = {f"@{g}": st.m for g, st in self.sharded.items()}
                return moments_state(m, {f"@{g}": st.v for g, st in self.sharded.items()}, self.adam_t)
            return moments_state(self.m, self.v, self.adam_t)
        if component == "lr_scheduler":
            return {"position": np.asarray(self.sched_pos, dtype=np.int64)}
        if component == "rng":
            return rng_state(self.rng)
        if component == "data_cursor":
            return {"epoch_cursor": self.sampler.state()}
        raise KeyError(component)

    def load(self, component: str, arrays: Mapping[str, np.ndarray]) -> None:
        """Restore ``component`` from arrays written by :meth:`state`."""
        if component == "params":
            self.params = {k: np.array(arrays[k], dtype=np.float32) for k in self.params}
        elif component == "optimizer" and self.sharded:
            m, v, self.adam_t = moments_from(arrays, (f"@{g}" for g in self.sharded))
            for g, st in self.sharded.items():
                st.m, st.v = m[f"@{g}"], v[f"@{g}"]
        elif component == "optimizer":
            self.m, self.v, self.adam_t = moments_from(arrays, self.params)
        elif component == "lr_scheduler":
            self.sched_pos = int(arrays["position"])
        elif component == "rng":
            load_rng_state(self.rng, arrays)
        elif component == "data_cursor":
            self.sampler.load(arrays["epoch_cursor"])
        else:
            raise KeyError(component)

    def params_digest(self) -> str:
        """sha256 over this rank's parameters in name order."""
        return digest(self.params)


INFO = register(
    WorkloadInfo(
        name="transformer",
        description="transformer-like blocks (LN, GeLU MLP, residual; optional MoE) under DP x TP x PP x EP",
        factory=TransformerRank,
        options=DEFAULTS,
        option_docs=option_docs.TRANSFORMER,
        validate=validate,
        host_bytes=host_bytes,
        rng_per_rank=False,  # one key stream on every rank: the masks are counter-based
    )
)
