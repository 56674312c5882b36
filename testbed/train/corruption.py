"""Silent data corruption inside a rank: bits flipped, or a relative bias, in its arrays.

A fault kind (:mod:`faults.integrity`) sets the rank's ``sdc`` knob to a
spec; the NPU calls :func:`strike` on the arrays the spec names (its local
gradients before the reduction, or its parameters at rest at the start of a
step) and the step's result carries what was changed, so the journal holds
the truth a detector is scored against. Every choice is drawn from the run's
seed, the fault, the rank and the step: the same scenario corrupts the same
bits.

An integer (a sample index) takes a flip of any of its bits (``sign`` is its
top bit): a low one reads a wrong sample, silently; a high one sends the
index out of range, and the operation that uses it later fails.

Bit fields follow IEEE 754 (float32: mantissa bits 0-22, exponent 23-30,
sign 31; float64: 0-51, 52-62, 63; float16: 0-9, 10-14, 15).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from testbed.core.seeding import stream

#: per float width in bits: (mantissa bits, exponent bits); the sign is the top bit
FIELDS = {16: (10, 5), 32: (23, 8), 64: (52, 11)}
#: how the bits to flip are chosen
BIT_CHOICES = ("sign", "exponent", "mantissa", "random")
#: when the corruption strikes, from its first step on
PERSISTENCE = ("transient", "intermittent", "persistent")


@dataclass(frozen=True)
class CorruptionSpec:
    """What an ``sdc`` knob holds: one fault's corruption of one rank."""

    fault: str
    where: str  # "gradient", "params", "optimizer", "payload", "activation" or "index"
    first_step: int
    seed: int
    bits: str = "mantissa"
    k: int = 1
    bit: int | None = None
    bias: float = 0.0
    elements: int = 1
    probability: float = 1.0
    persistence: str = "transient"
    #: every this many steps from the first, it doubles the values it corrupts and, intermittent,
    #: its probability (up to 1): a failing NPU getting worse (0: never)
    escalate_every: int = 0
    #: ``where: payload``: the sender of the link it strikes, and the half of the allreduce
    #: (``reduce_scatter`` or ``allgather``; empty: either)
    src: int = -1
    half: str = ""
    #: ``where: activation``: the pass whose output it strikes (``forward`` or ``backward``)
    during: str = ""

    def to_knob(self) -> str:
        """The knob's value."""
        return json.dumps(self.__dict__, sort_keys=True)

    @classmethod
    def from_knob(cls, value: str) -> CorruptionSpec | None:
        """The spec a knob holds (None: healthy)."""
        return cls(**json.loads(value)) if value else None

    def strikes(self, rank: int, step: int, attempt: int = 0, struck: bool = False) -> bool:
        """Whether it strikes ``rank``'s run of ``step`` (its ``attempt``-th step run; ``struck``: it
        struck this process before). Transient: once, at the first step run from its first step on;
        intermittent: each step run from then on with ``probability``, drawn per run (a step run
        again after a rollback draws again); persistent: every step run from then on."""
        if step < self.first_step or (self.persistence == "transient" and struck):
            return False
        chance = min(1.0, self.probability * self.escalation(step))
        if self.persistence != "intermittent" or chance >= 1.0:
            return True
        draw = stream(self.seed, "sdc-occurs", self.fault, rank, step, attempt)
        return bool(draw.random() < chance)

    def escalation(self, step: int) -> int:
        """How many times over it strikes at ``step``: 2 to the escalations since its first step."""
        if self.escalate_every <= 0 or step < self.first_step:
            return 1
        return int(2 ** min((step - self.first_step) // self.escalate_every, 20))


def _flip_bits(spec: CorruptionSpec, width: int, rng: np.random.Generator, integer: bool) -> list[int]:
    if spec.bit is not None:
        return [spec.bit]
    if spec.bits == "sign":
        return [width - 1]
    if integer:  # no exponent or mantissa: k of its bits
        return sorted(int(b) for b in rng.choice(width, size=min(spec.k, width), replace=False))
    mantissa, exponent = FIELDS[width]
    if spec.bits == "exponent":
        return [int(rng.integers(mantissa, mantissa + exponent))]
    if spec.bits == "mantissa":
        return [int(rng.integers(0, mantissa))]
    return sorted(int(b) for b in rng.choice(width, size=min(spec.k, width), replace=False))


def strike(
    spec: CorruptionSpec,
    arrays: Mapping[str, np.ndarray],
    rank: int,
    step: int,
    attempt: int = 0,
    struck: bool = False,
) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
    """``arrays`` with the spec's corruption of ``step`` applied (copies of the arrays it changed),
    and one record per changed value: tensor, flat index, bits flipped, the value before and after
    (``attempt``, ``struck``: as :meth:`CorruptionSpec.strikes` takes them)."""
    if not spec.strikes(rank, step, attempt, struck):
        return dict(arrays), []
    rng = stream(spec.seed, "sdc", spec.fault, rank, step)
    kinds = "iu" if spec.where == "index" else "f"
    names = [n for n in sorted(arrays) if arrays[n].dtype.kind in kinds and arrays[n].size]
    if not names:
        return dict(arrays), []
    out = dict(arrays)
    if spec.bias:
        for n in names:
            out[n] = (arrays[n] * (1.0 + spec.bias)).astype(arrays[n].dtype)
        return out, [{"fault": spec.fault, "where": spec.where, "bias": spec.bias, "tensors": len(names)}]
    sizes = np.array([arrays[n].size for n in names])
    records = []
    count = spec.elements * spec.escalation(step)
    for flat in sorted(rng.choice(int(sizes.sum()), size=min(count, int(sizes.sum())), replace=False)):
        i = int(np.searchsorted(np.cumsum(sizes), flat, side="right"))
        name, index = names[i], int(flat - (sizes[:i].sum() if i else 0))
        if out[name] is arrays[name]:
            out[name] = arrays[name].copy()
        values = out[name].reshape(-1)
        width = values.dtype.itemsize * 8
        bits = _flip_bits(spec, width, rng, integer=values.dtype.kind != "f")
        as_int = values.view(f"u{values.dtype.itemsize}")
        before = values[index].item()
        for b in bits:
            as_int[index] ^= np.array(1 << b, dtype=as_int.dtype)
        records.append(
            {
                "fault": spec.fault,
                "where": spec.where,
                "tensor": name,
                "index": index,
                "bits": bits,
                "before": before,
                "after": values[index].item(),
            }
        )
    return out, records


def gradient_norm(arrays: Mapping[str, np.ndarray]) -> float:
    """The L2 norm over every array, in float64 (inf or NaN when a value is): what a validator reads."""
    with np.errstate(over="ignore", invalid="ignore"):
        total = sum(
            float(np.sum(np.square(a, dtype=np.float64))) for a in arrays.values() if a.dtype.kind == "f"
        )
    return float(np.sqrt(total))
