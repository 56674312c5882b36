"""The transformer-like model's definition: options, parameter shapes, initial values, data, and cuts.

Shared by the distributed model (:mod:`workloads.transformer`) and its
single-process reference (:mod:`workloads.reference`): both start from the
same full parameters and the same data; only the distributed one cuts them.

The model: ``embed`` (inputs -> d_model), ``layers`` residual blocks, ``head``
(d_model -> outputs), mean squared error against a seeded teacher network.
A dense block is ``x + W2·dropout(GeLU(W1·LN(x) + b1)) + b2``; a MoE block
(every ``moe_every``-th) is ``x + Σ_top-k p_e · expert_e(LN(x))`` with a
softmax gate (Shazeer et al. 2017) and no capacity limit (dropless), so the
result does not depend on how tokens are cut into micro-batches.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from testbed.core.seeding import stream
from testbed.topology.layout import Coords, Layout

Arrays = dict[str, np.ndarray]

DEFAULTS: dict[str, Any] = {
    "inputs": 16,
    "d_model": 64,
    "ffn": 256,
    "layers": 4,
    "outputs": 4,
    "moe_every": 0,
    "experts": 4,
    "top_k": 2,
    "expert_ffn": 128,
    "router_skew": 0.0,
    "batch": 32,
    "micro_batches": 2,
    "samples": 4096,
    "lr": 1e-3,
    "min_lr": 1e-4,
    "warmup": 5,
    "weight_decay": 0.01,
    "dropout": 0.1,
    "clip": 1.0,
    "zero": 0,
}

_EXPERT = re.compile(r"^blk(\d+)\.e(\d+)\.")
_BLOCK = re.compile(r"^blk(\d+)\.")


def options_of(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` over the defaults."""
    return {**DEFAULTS, **options}


def gate_logits(hn: np.ndarray, gate: np.ndarray, o: Mapping[str, Any]) -> np.ndarray:
    """The MoE gate's logits, ``hn @ gate``, with ``router_skew`` added to expert 0's: a router that
    prefers one expert, as one trained without a load-balancing loss does (Shazeer et al. 2017,
    section 4: "the gating network tends to converge to a state where it always produces large
    weights for the same few experts"). The skew is a constant, so the gradient's formula is the
    same (its values follow the skewed probabilities)."""
    logits = hn @ gate
    skew = float(o["router_skew"])
    if skew:
        logits[:, 0] += np.float32(skew)
    return logits


def block_kinds(o: Mapping[str, Any]) -> list[str]:
    """``dense`` or ``moe`` for each block."""
    every = int(o["moe_every"])
    return ["moe" if every and (i + 1) % every == 0 else "dense" for i in range(int(o["layers"]))]


def full_shapes(o: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every parameter's full (uncut) shape, in a fixed order."""
    d, f, fe = int(o["d_model"]), int(o["ffn"]), int(o["expert_ffn"])
    shapes: dict[str, tuple[int, ...]] = {"embed.w": (int(o["inputs"]), d), "embed.b": (d,)}
    for i, kind in enumerate(block_kinds(o)):
        shapes[f"blk{i}.ln.g"], shapes[f"blk{i}.ln.b"] = (d,), (d,)
        if kind == "dense":
            shapes.update(
                {f"blk{i}.w1": (d, f), f"blk{i}.b1": (f,), f"blk{i}.w2": (f, d), f"blk{i}.b2": (d,)}
            )
            continue
        shapes[f"blk{i}.gate"] = (d, int(o["experts"]))
        for e in range(int(o["experts"])):
            p = f"blk{i}.e{e}"
            shapes.update({f"{p}.w1": (d, fe), f"{p}.b1": (fe,), f"{p}.w2": (fe, d), f"{p}.b2": (d,)})
    shapes["head.w"], shapes["head.b"] = (d, int(o["outputs"])), (int(o["outputs"]),)
    return shapes


def param_count(o: Mapping[str, Any]) -> int:
    """How many parameters :func:`full_shapes` has, counted without listing them."""
    d, f, fe = int(o["d_model"]), int(o["ffn"]), int(o["expert_ffn"])
    layers, every, experts = int(o["layers"]), int(o["moe_every"]), int(o["experts"])
    moe = layers // every if every else 0
    dense = (layers - moe) * (2 * d + d * f + f + f * d + d)
    sparse = moe * (2 * d + d * experts + experts * (d * fe + fe + fe * d + d))
    return int(o["inputs"]) * d + d + dense + sparse + d * int(o["outputs"]) + int(o["outputs"])


def host_bytes(o: Mapping[str, Any], layout: Layout) -> int:
    """What one rank's process holds, from the shapes: the full initial parameters (every rank makes
    them, then keeps its cut) with its share's Adam moments, gradients and the update's temporaries
    (8 copies of the whole, an upper bound), the data set (inputs, targets and the teacher's float64
    hidden activations while it is made), and the activations of a micro-batch's blocks."""
    o = options_of(o)
    n, width = int(o["samples"]), int(o["inputs"]) + 2 * int(o["outputs"])
    data = n * (width * 4 + 2 * 32 * 8)
    hidden = 4 * int(o["d_model"]) + int(o["ffn"]) + int(o["top_k"]) * int(o["expert_ffn"])
    activations = 4 * int(o["batch"]) * hidden * int(o["layers"]) * 4
    return 9 * param_count(o) * 4 + data + activations


def init_params(seed: int, o: Mapping[str, Any]) -> Arrays:
    """Full initial parameters: weights ~ N(0, 1/fan_in), biases 0, layer-norm gains 1."""
    params: Arrays = {}
    for name, shape in full_shapes(o).items():
        if name.endswith(".ln.g"):
            params[name] = np.ones(shape, dtype=np.float32)
        elif len(shape) == 1:
            params[name] = np.zeros(shape, dtype=np.float32)
        else:
            w = stream(seed, "init", name).standard_normal(shape) / math.sqrt(shape[0])
            params[name] = w.astype(np.float32)
    return params


def make_dataset(seed: int, o: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and targets of a seeded teacher network ``tanh(x·T1)·T2`` plus a little noise (made once
    per process, read-only: NPU processes forked after their host made it share its pages)."""
    return _dataset(seed, int(o["samples"]), int(o["inputs"]), int(o["outputs"]))


@functools.lru_cache(maxsize=4)
def _dataset(seed: int, n: int, d: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    x = stream(seed, "data", "x").standard_normal((n, d)).astype(np.float32)
    t1 = stream(seed, "data", "t1").standard_normal((d, 32)) / math.sqrt(d)
    t2 = stream(seed, "data", "t2").standard_normal((32, out)) / math.sqrt(32)
    noise = 0.01 * stream(seed, "data", "noise").standard_normal((n, out))
    return read_only(x), read_only((np.tanh(x @ t1) @ t2 + noise).astype(np.float32))


def read_only(a: np.ndarray) -> np.ndarray:
    """``a``, made read-only (a dataset shared by every rank of a process: any write would raise)."""
    a.setflags(write=False)
    return a


def stage_blocks(o: Mapping[str, Any], pp: int) -> list[list[int]]:
    """The blocks of each pipeline stage: contiguous, as even as possible."""
    return [list(map(int, part)) for part in np.array_split(np.arange(int(o["layers"])), pp)]


def is_expert(name: str) -> bool:
    """Whether ``name`` belongs to an expert (its gradient is averaged over DP only)."""
    return _EXPERT.match(name) is not None


@dataclass(frozen=True)
class Cut:
    """Which part of a full parameter one rank holds: ``axis`` and ``[start, stop)``, or all of it."""

    axis: int | None = None
    start: int = 0
    stop: int = 0

    def take(self, full: np.ndarray) -> np.ndarray:
        """This rank's part of ``full``."""
        if self.axis is None:
            return full.copy()
        index = [slice(None)] * full.ndim
        index[self.axis] = slice(self.start, self.stop)
        return np.ascontiguousarray(full[tuple(index)])

    def put(self, full: np.ndarray, part: np.ndarray) -> None:
        """Write ``part`` back into ``full``."""
        if self.axis is None:
            full[...] = part
            return
        index = [slice(None)] * full.ndim
        index[self.axis] = slice(self.start, self.stop)
        full[tuple(index)] = part


def cuts_of(o: Mapping[str, Any], layout: Layout, c: Coords) -> dict[str, Cut]:
    """The parameters the rank at ``c`` holds, and how each is cut (Megatron-style TP, EP by expert)."""
    stages = stage_blocks(o, layout.pp)
    mine = set(stages[c.pp])
    f = int(o["ffn"])
    lo, hi = c.tp * f // layout.tp, (c.tp + 1) * f // layout.tp
    per = int(o["experts"]) // layout.ep
    cuts: dict[str, Cut] = {}
    for name in full_shapes(o):
        block = _BLOCK.match(name)
        if (name.startswith("embed.") and c.pp != 0) or (name.startswith("head.") and c.pp != layout.pp - 1):
            continue
        if block is not None and int(block.group(1)) not in mine:
            continue
        expert = _EXPERT.match(name)
        if expert is not None and not c.ep * per <= int(expert.group(2)) < (c.ep + 1) * per:
            continue
        if expert is None and name.endswith((".w1", ".b1")):
            cuts[name] = Cut(1 if name.endswith(".w1") else 0, lo, hi)  # column-parallel
        elif expert is None and name.endswith(".w2"):
            cuts[name] = Cut(0, lo, hi)  # row-parallel
        else:
            cuts[name] = Cut()
    return cuts


def counted_in_norm(name: str, cut: Cut, c: Coords) -> bool:
    """Whether this rank adds ``name`` to the global gradient norm (each element counted once).

    Parameters replicated across TP are counted on TP index 0; dense ones
    replicated across EP on EP index 0. DP replicas never add (the norm is
    reduced over the ranks of one DP index).
    """
    if cut.axis is None and c.tp != 0:
        return False
    return is_expert(name) or c.ep == 0


def assemble(o: Mapping[str, Any], layout: Layout, per_rank: Mapping[int, Arrays]) -> Arrays:
    """The full parameters from every rank's parts (for comparing with the reference)."""
    full = {k: np.full(s, np.nan, dtype=np.float32) for k, s in full_shapes(o).items()}
    for rank, arrays in per_rank.items():
        for name, cut in cuts_of(o, layout, layout.coords(rank)).items():
            cut.put(full[name], arrays[name])
    return full


class Sampler:
    """A sampler over the whole dataset: a seeded permutation per epoch, a cursor into it."""

    def __init__(self, seed: int, samples: int) -> None:
        self.seed, self.samples = seed, samples
        self.epoch, self.cursor = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> np.ndarray:
        return stream(self.seed, "sampler", self.epoch).permutation(self.samples)

    def next(self, n: int) -> np.ndarray:
        """The next ``n`` dataset indices (wrapping into a new epoch when one ends)."""
        out: list[int] = []
        while len(out) < n:
            if self.cursor >= self.samples:
                self.epoch, self.cursor = self.epoch + 1, 0
                self._order = self._permutation()
            take = min(n - len(out), self.samples - self.cursor)
            out.extend(self._order[self.cursor : self.cursor + take].tolist())
            self.cursor += take
        return np.asarray(out, dtype=np.int64)

    def state(self) -> np.ndarray:
        """(epoch, cursor)."""
        return np.asarray([self.epoch, self.cursor], dtype=np.int64)

    def load(self, arr: np.ndarray) -> None:
        """Restore from :meth:`state`."""
        self.epoch, self.cursor = (int(v) for v in arr)
        self._order = self._permutation()


def dropout_generator(seed: int) -> np.random.Generator:
    """The dropout generator each rank keeps (one key per step; the same stream on every rank)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 0xD20])))


def rng_state(rng: np.random.Generator) -> Arrays:
    """A PCG64 generator's state as arrays (128-bit words split in two)."""
    st = rng.bit_generator.state
    words = [st["state"]["state"], st["state"]["inc"]]
    parts = [(w >> 64) & (2**64 - 1) for w in words] + [w & (2**64 - 1) for w in words]
    return {
        "pcg64": np.asarray(parts, dtype=np.uint64),
        "spare": np.asarray([st["has_uint32"], st["uinteger"]], dtype=np.uint64),
    }


def load_rng_state(rng: np.random.Generator, arrays: Mapping[str, np.ndarray]) -> None:
    """Restore a generator from :func:`rng_state`."""
    hi_s, hi_i, lo_s, lo_i = (int(v) for v in arrays["pcg64"])
    spare = [int(v) for v in arrays["spare"]]
    rng.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": (hi_s << 64) | lo_s, "inc": (hi_i << 64) | lo_i},
        "has_uint32": spare[0],
        "uinteger": spare[1],
    }


def validate(o: Mapping[str, Any], layout: Layout) -> list[str]:
    """What makes ``o`` unusable with ``layout``, each with its fix."""
    problems = []
    m, b = int(o["micro_batches"]), int(o["batch"])
    if m < 1:
        return [f"micro_batches {o['micro_batches']} must be at least 1 (for instance 2)"]
    if b < layout.replicas * m or b % (layout.replicas * m):
        problems.append(
            f"batch {b} must split evenly over dp x ep = {layout.replicas} replicas and {m} micro-batches; "
            f"use a multiple of {layout.replicas * m}"
        )
    if int(o["ffn"]) % layout.tp:
        problems.append(f"ffn {o['ffn']} must be a multiple of tp = {layout.tp}")
    if int(o["layers"]) < layout.pp:
        problems.append(f"layers {o['layers']} must be at least pp = {layout.pp} (one block per stage)")
    if layout.ep > 1 and not int(o["moe_every"]):
        problems.append(f"ep = {layout.ep} needs MoE blocks; set moe_every (for instance 2)")
    if int(o["moe_every"]) and int(o["experts"]) % layout.ep:
        problems.append(f"experts {o['experts']} must be a multiple of ep = {layout.ep}")
    if o["zero"] not in (0, 1):
        problems.append(f"zero {o['zero']} must be 0 (gradient allreduce) or 1 (reduce-scatter + allgather)")
    if o["router_skew"] and not int(o["moe_every"]):
        problems.append(
            f"router_skew {o['router_skew']} needs MoE blocks to route; set moe_every (for instance 2)"
        )
    if int(o["moe_every"]) and not 1 <= int(o["top_k"]) <= int(o["experts"]):
        problems.append(f"top_k {o['top_k']} must be between 1 and experts ({o['experts']})")
    return problems
