"""Silent data corruption against published figures: what a random bit flip does to the values a
validator reads, and what a small relative bias does.

Published fleets report that NaN or Inf are about 1 % of silent-corruption
outcomes and that a faulty accelerator may show a relative bias under 1e-3
with no other signal (ByteDance, 2025). This measures the testbed's side on
the MLP workload's real local gradients: one random bit of one value flipped
(``bits: random, k: 1``, drawn ``draws`` times from distinct seeds), and how
many of those flips make the value non-finite, or lift the rank's gradient
norm past a spike validator's factor (the check Megatron makes at 10x).

    python -m testbed.experiments.sdc_calibration [--draws 4000] [--factor 10]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from testbed.topology.layout import Layout
from testbed.train.corruption import CorruptionSpec, gradient_norm, strike
from workloads.base import WORKLOADS, Arrays
from workloads.mlp import MLPRegression


@dataclass(frozen=True)
class FlipOutcomes:
    """What ``draws`` single random-bit flips did to one rank's local gradients."""

    draws: int
    non_finite: int  #: flips that made the value NaN or infinite
    past_factor: int  #: flips that lifted the gradient norm past ``factor`` times its clean value
    factor: float

    @property
    def non_finite_share(self) -> float:
        """The share of flips a NaN/Inf check sees."""
        return self.non_finite / self.draws

    @property
    def seen_share(self) -> float:
        """The share of flips a NaN/Inf check or a spike validator at ``factor`` sees."""
        return (self.non_finite + self.past_factor) / self.draws


def mlp_gradients(seed: int = 3, steps: int = 5) -> Arrays:
    """One rank's local gradients of the MLP workload after ``steps`` steps of training."""
    w = MLPRegression({**WORKLOADS["mlp"].options, "steps": 100}, seed, 0, Layout(dp=1))
    for _ in range(steps):
        _, grads, _ = w.local_step()
        w.apply(None, grads)
    return w.local_step()[1]


def flip_outcomes(grads: Arrays, draws: int = 4000, factor: float = 10.0) -> FlipOutcomes:
    """Flip one random bit of one value ``draws`` times (seeds 0..draws-1) and count the outcomes."""
    clean = gradient_norm(grads)
    non_finite = past = 0
    for seed in range(draws):
        spec = CorruptionSpec(fault="flip", where="gradient", first_step=0, seed=seed, bits="random", k=1)
        out, (hit,) = strike(spec, grads, rank=0, step=1)
        if not np.isfinite(hit["after"]):
            non_finite += 1
        elif gradient_norm(out) > factor * clean:
            past += 1
    return FlipOutcomes(draws, non_finite, past, factor)


def bias_norm_ratio(grads: Arrays, bias: float = 1e-3) -> float:
    """How much a relative ``bias`` in every value moves the gradient norm (a spike needs 10x)."""
    spec = CorruptionSpec(fault="bias", where="gradient", first_step=0, seed=0, bias=bias)
    return gradient_norm(strike(spec, grads, rank=0, step=1)[0]) / gradient_norm(grads)


def main(argv: list[str] | None = None) -> int:
    """Print the figures docs/fidelity.md quotes."""
    parser = argparse.ArgumentParser(prog="python -m testbed.experiments.sdc_calibration")
    parser.add_argument("--draws", type=int, default=4000)
    parser.add_argument("--factor", type=float, default=10.0)
    args = parser.parse_args(argv)
    grads = mlp_gradients()
    o = flip_outcomes(grads, args.draws, args.factor)
    print(f"single random-bit flips of one gradient value, {o.draws} draws (mlp, rank 0, step 6):")
    print(f"  NaN or Inf: {o.non_finite} ({o.non_finite_share * 100:.2f} %)")
    print(f"  gradient norm past {o.factor:g}x: {o.past_factor} ({o.past_factor / o.draws * 100:.2f} %)")
    print(f"  seen by a NaN/Inf check or a {o.factor:g}x spike validator: {o.seen_share * 100:.2f} %")
    print(f"a relative bias of 1e-3 moves the gradient norm by a factor of {bias_norm_ratio(grads):.6f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
