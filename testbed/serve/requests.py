"""A seeded request stream: when requests arrive, and how long their prompts and outputs are.

Arrivals are a Poisson process of ``rate`` requests a second (exponential
gaps: the open-loop load a serving benchmark sends), over a horizon of
virtual time, with bursts on top: at ``at_s``, ``count`` requests at once,
with lengths of their own (a burst of long prompts is the KV-cache pressure
that issue 18 rehearses). A length is fixed, uniform between two bounds, or
log-normal about a median, clipped to its bounds.

Every draw comes from a named stream of its own (:mod:`testbed.core.seeding`):
the base stream's gaps, prompt lengths and output lengths, and each burst's
lengths by its index. So the same spec and seed give the same requests, and
adding or changing a burst never moves a request of the base stream (common
random numbers: two policies compared on one stream face the same load).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from testbed.core.errors import TestbedError
from testbed.core.seeding import stream

LENGTH_KINDS = ("fixed", "uniform", "lognormal")


@dataclass(frozen=True)
class Lengths:
    """A token-length distribution: ``fixed`` (``low``), ``uniform`` on ``[low, high]``, or
    ``lognormal`` with median ``median`` and shape ``sigma``, clipped to ``[low, high]``."""

    kind: str = "fixed"
    low: int = 128
    high: int = 128
    median: float = 0.0
    sigma: float = 1.0

    def problems(self, where: str) -> list[str]:
        """What makes this distribution unusable, each naming ``where`` and the fix."""
        out = []
        if self.kind not in LENGTH_KINDS:
            out.append(f"{where}: kind {self.kind!r} is not one of {', '.join(LENGTH_KINDS)}")
        if self.low < 1 or self.high < self.low:
            out.append(f"{where}: bounds [{self.low}, {self.high}] need 1 <= low <= high")
        if self.kind == "lognormal" and (self.median <= 0 or self.sigma <= 0):
            out.append(
                f"{where}: a lognormal needs median > 0 and sigma > 0, got {self.median}, {self.sigma}"
            )
        return out

    def draw(self, rng: np.random.Generator, n: int) -> list[int]:
        """``n`` lengths."""
        if self.kind == "fixed":
            return [self.low] * n
        if self.kind == "uniform":
            return [int(x) for x in rng.integers(self.low, self.high + 1, size=n)]
        raw = rng.lognormal(math.log(self.median), self.sigma, size=n)
        return [int(min(self.high, max(self.low, round(x)))) for x in raw]


@dataclass(frozen=True)
class Burst:
    """``count`` requests arriving together at virtual time ``at_s``."""

    at_s: float
    count: int
    prompt: Lengths = field(default_factory=Lengths)
    output: Lengths = field(default_factory=Lengths)


@dataclass(frozen=True)
class StreamSpec:
    """Poisson arrivals of ``rate`` a second up to ``horizon_s``, their lengths, and bursts."""

    rate: float
    horizon_s: float
    prompt: Lengths = field(default_factory=Lengths)
    output: Lengths = field(default_factory=Lengths)
    bursts: tuple[Burst, ...] = ()

    def problems(self) -> list[str]:
        """What makes the spec unusable, each with where and how to fix it."""
        out = []
        if not self.rate >= 0 or not self.horizon_s > 0:
            out.append(f"a stream needs rate >= 0 and horizon_s > 0, got {self.rate} and {self.horizon_s}")
        out += self.prompt.problems("prompt") + self.output.problems("output")
        for i, b in enumerate(self.bursts):
            if b.count < 1 or not 0 <= b.at_s <= self.horizon_s:
                out.append(
                    f"bursts[{i}]: {b.count} requests at {b.at_s} s; give count >= 1 and at_s within "
                    f"[0, {self.horizon_s}]"
                )
            out += b.prompt.problems(f"bursts[{i}].prompt") + b.output.problems(f"bursts[{i}].output")
        return out


@dataclass(frozen=True)
class Request:
    """One request: its id, arrival in virtual seconds, prompt and output tokens, and the burst it
    came in (None: the base stream)."""

    id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    burst: int | None = None


def _base(spec: StreamSpec, seed: int) -> list[Request]:
    gaps = stream(seed, "serve", "arrivals")
    times: list[float] = []
    t = 0.0
    while spec.rate > 0:
        t += float(gaps.exponential(1.0 / spec.rate))
        if t > spec.horizon_s:
            break
        times.append(t)
    prompts = spec.prompt.draw(stream(seed, "serve", "prompt"), len(times))
    outputs = spec.output.draw(stream(seed, "serve", "output"), len(times))
    return [Request(f"r{n:06d}", t, p, o) for n, (t, p, o) in enumerate(zip(times, prompts, outputs))]


def generate(spec: StreamSpec, seed: int) -> tuple[Request, ...]:
    """The requests of ``spec`` under ``seed``, in order of arrival (a burst's after the base
    stream's at the same instant). The base stream's are ``r000000``, ``r000001``, ... in order;
    burst ``i``'s ``b{i}-0000``, ... so no burst renames them. Raises TestbedError naming what is
    wrong with the spec."""
    wrong = spec.problems()
    if wrong:
        raise TestbedError("request stream: " + "; ".join(wrong), problems=wrong)
    out = _base(spec, seed)
    for i, b in enumerate(spec.bursts):
        prompts = b.prompt.draw(stream(seed, "serve", "burst", i, "prompt"), b.count)
        outputs = b.output.draw(stream(seed, "serve", "burst", i, "output"), b.count)
        out += [Request(f"b{i}-{k:04d}", b.at_s, p, o, i) for k, (p, o) in enumerate(zip(prompts, outputs))]
    out.sort(key=lambda r: (r.arrival_s, -1 if r.burst is None else r.burst, r.id))
    return tuple(out)
