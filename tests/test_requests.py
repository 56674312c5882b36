"""The seeded request stream: the same spec and seed give the same requests, Poisson at its rate,
lengths in their bounds, bursts that never move the base stream's requests."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from testbed.core.errors import TestbedError
from testbed.serve.requests import Burst, Lengths, StreamSpec, generate

LONG = Lengths("lognormal", low=64, high=32768, median=2048, sigma=1.0)
SPEC = StreamSpec(rate=4.0, horizon_s=600.0, prompt=LONG, output=Lengths("uniform", 16, 512))


def test_one_spec_and_seed_give_one_stream_and_another_seed_another() -> None:
    a, b = generate(SPEC, 7), generate(SPEC, 7)
    assert a == b and a != generate(SPEC, 8)
    assert [r.id for r in a[:3]] == ["r000000", "r000001", "r000002"]
    assert all(x.arrival_s <= y.arrival_s for x, y in itertools.pairwise(a))


def test_arrivals_are_poisson_at_the_rate_and_lengths_keep_their_bounds() -> None:
    counts = [len(generate(SPEC, seed)) for seed in range(20)]
    mean, expected = sum(counts) / len(counts), SPEC.rate * SPEC.horizon_s  # 2400 each
    assert abs(mean - expected) < 5 * math.sqrt(expected / len(counts))  # 5 sigma of the mean
    reqs = generate(SPEC, 1)
    prompts = sorted(r.prompt_tokens for r in reqs)
    assert prompts[0] >= 64 and prompts[-1] <= 32768
    assert 0.8 * 2048 < prompts[len(prompts) // 2] < 1.25 * 2048  # the median, as asked
    assert all(16 <= r.output_tokens <= 512 for r in reqs)
    fixed = generate(dataclasses.replace(SPEC, prompt=Lengths("fixed", 1000, 1000)), 1)
    assert {r.prompt_tokens for r in fixed} == {1000}


def test_a_burst_arrives_at_once_and_moves_none_of_the_base_streams_requests() -> None:
    burst = Burst(at_s=120.0, count=32, prompt=Lengths("fixed", 30000, 30000))
    base, with_burst = generate(SPEC, 3), generate(dataclasses.replace(SPEC, bursts=(burst,)), 3)
    assert [r for r in with_burst if r.burst is None] == list(base)  # common random numbers
    mine = [r for r in with_burst if r.burst == 0]
    assert len(mine) == 32 and {r.arrival_s for r in mine} == {120.0}
    assert {r.prompt_tokens for r in mine} == {30000} and mine[0].id == "b0-0000"
    only = generate(StreamSpec(rate=0.0, horizon_s=10.0, bursts=(Burst(1.0, 3),)), 0)
    assert [r.id for r in only] == ["b0-0000", "b0-0001", "b0-0002"]


def test_a_bad_spec_is_named_with_its_fix() -> None:
    with pytest.raises(TestbedError) as bad:
        generate(
            StreamSpec(rate=-1, horizon_s=10, prompt=Lengths("zipf"), bursts=(Burst(at_s=20, count=0),)), 0
        )
    text = str(bad.value)
    assert "rate >= 0 and horizon_s > 0, got -1" in text
    assert "prompt: kind 'zipf' is not one of fixed, uniform, lognormal" in text
    assert "bursts[0]: 0 requests at 20 s; give count >= 1 and at_s within [0, 10]" in text
    assert len(bad.value.problems) == 3
