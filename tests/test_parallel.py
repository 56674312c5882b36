"""DP x TP x PP x EP: the cut transformer matches its single-process reference, and itself bit for bit.

Ranks run as threads with real data planes (no Ray), so Hypothesis can try
many layouts. Tolerance against the reference: 1e-5 absolute on parameters
and Adam's first moment, 1e-5 relative on the loss, over a few steps. Why: a
cut model sums the same float32 terms in another order (TP splits the inner
dimension of ``W2``, micro-batches and replicas split the batch sums, an
allreduce adds in ring order), which moves results by a few ulps per
operation; measured worst over 21 layout and seed pairs: 1.2e-7 on
parameters, 2.2e-7 relative on the loss. A cut that is wrong (a wrong
shard, a missing average) moves them by 1e-3 or more. The first moment is
compared as well because AdamW's update is blind to a constant gradient
scale, the moment is not. One exception: where a gradient element comes
within 100 ε of zero (ε = 1e-8), Adam's ``g / (|g| + ε)`` turns a rounding
difference into a visible step, so such elements may differ up to the bound
on Adam's step (found by Hypothesis: a step-1 gradient of -1.8e-8 moved one
weight by 1.07e-5).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from testbed.core.errors import UnsupportedOperator
from testbed.topology.layout import Layout
from tests.ranks import Job, on_all
from workloads import COMPONENTS
from workloads.blockspec import Arrays, options_of
from workloads.layers import lr_at
from workloads.reference import Reference
from workloads.transformer import one_f_one_b

SMALL = {"layers": 4, "d_model": 32, "ffn": 64, "expert_ffn": 32, "experts": 4, "batch": 16}
TOL = 1e-5
ADAM_EPS = 1e-8
STEPS = 50  # the schedule's length (steps run are fewer)

LAYOUTS = [
    Layout(dp=2),
    Layout(tp=2),
    Layout(pp=2),
    Layout(ep=2),
    Layout(tp=4),
    Layout(pp=4),
    Layout(dp=2, tp=2),
    Layout(dp=2, pp=2),
    Layout(tp=2, pp=2),
    Layout(tp=2, ep=2),
    Layout(pp=2, ep=2),
    Layout(dp=2, tp=2, pp=2),
    Layout(tp=2, pp=2, ep=2),
    Layout(dp=2, pp=2, ep=2),
]


def reference_run(options: dict[str, Any], seed: int, steps: int) -> tuple[list[float], Reference, Arrays]:
    """The reference's losses, final state, and where a gradient came within 100 ε of zero."""
    ref = Reference({**options, "steps": STEPS}, seed)
    losses, near_zero = [], {k: np.zeros(v.shape, dtype=bool) for k, v in ref.params.items()}
    for _ in range(steps):
        losses.append(ref.step())
        for k, g in ref.last_grads.items():
            near_zero[k] |= np.abs(g) < 100 * ADAM_EPS
    return losses, ref, near_zero


def adam_step_bound(options: dict[str, Any], steps: int) -> float:
    """How far AdamW's normalised steps can move one element: Σ lr_t (1-β1)/√(1-β2) (Kingma & Ba, 2.1)."""
    o = options_of(options)
    lrs = [lr_at(t, STEPS, float(o["lr"]), float(o["min_lr"]), int(o["warmup"])) for t in range(steps)]
    return 2 * sum(lrs) * 0.1 / math.sqrt(0.001)


def assert_matches(job: Job, losses: list[float], options: dict[str, Any], seed: int, steps: int) -> None:
    ref_losses, ref, near_zero = reference_run(options, seed, steps)
    np.testing.assert_allclose(losses, ref_losses, rtol=TOL)
    moment, params, bound = job.full_moment(), job.full_params(), adam_step_bound(options, steps)
    for k in ref.params:
        assert not np.isnan(params[k]).any(), f"{k}: no rank holds part of it"
        np.testing.assert_allclose(moment[k], ref.m[k], rtol=0, atol=TOL, err_msg=f"first moment {k}")
        allowed = np.where(near_zero[k], bound, TOL)
        worst = np.abs(params[k] - ref.params[k]) - allowed
        assert worst.max() <= 0, f"{k}: parameters differ by {worst.max():.3g} beyond the tolerance"


@settings(max_examples=12, deadline=None)
@given(
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**31),
    micro=st.sampled_from([1, 2, 4]),
    moe=st.booleans(),
    top_k=st.integers(1, 2),
    dropout=st.sampled_from([0.0, 0.1]),
    zero=st.sampled_from([0, 1]),
)
@example(
    layout=Layout(dp=2), seed=35866136, micro=2, moe=True, top_k=1, dropout=0.0, zero=0
)  # a near-zero gradient
def test_distributed_matches_the_single_process_reference(
    layout: Layout, seed: int, micro: int, moe: bool, top_k: int, dropout: float, zero: int
) -> None:
    options = {
        **SMALL,
        "zero": zero,
        "micro_batches": micro,
        "moe_every": 2 if moe or layout.ep > 1 else 0,
        "top_k": top_k,
        "dropout": dropout,
        "batch": 8 * layout.replicas * micro,
    }
    with Job(layout, options, seed, steps=STEPS) as job:
        job.open()
        losses = job.train(1, 3)
        assert_matches(job, losses, {**options}, seed, 3)


@pytest.mark.parametrize("zero", [0, 1])
@pytest.mark.parametrize("layout", [Layout(dp=2, tp=2, pp=2), Layout(dp=2, pp=2, ep=2)], ids=str)
def test_the_eight_rank_layouts_match_over_more_steps(layout: Layout, zero: int) -> None:
    options = {**SMALL, "moe_every": 2, "micro_batches": 2, "zero": zero}
    with Job(layout, options, 11, steps=STEPS) as job:
        job.open()
        losses = job.train(1, 6)
        assert_matches(job, losses, options, 11, 6)
        assert losses[-1] < losses[0]


def test_a_skewed_router_sends_most_tokens_to_expert_0_and_still_matches_the_reference() -> None:
    """``router_skew`` adds a constant to expert 0's gate logit: the rank holding it computes most of
    the experts' work, and the distributed run still equals the single-process reference."""
    options = {**SMALL, "moe_every": 2, "micro_batches": 2, "router_skew": 4.0, "top_k": 1}
    flops = {}
    for skew in (4.0, 0.0):
        with Job(Layout(ep=2), {**options, "router_skew": skew}, 3, steps=STEPS) as job:
            job.open()
            losses = job.train(1, 3)
            assert_matches(job, losses, {**options, "router_skew": skew}, 3, 3)
            flops[skew] = [o["flops"] for o in job.step(4)]
    assert flops[4.0][0] > 1.5 * flops[4.0][1]  # rank 0 holds experts 0 and 1
    assert flops[0.0][0] < 1.5 * flops[0.0][1]


def test_loss_falls_on_the_synthetic_task() -> None:
    losses, _, _ = reference_run({**SMALL, "moe_every": 2}, 4, 40)
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])


def run_twice(layout: Layout, options: dict[str, Any], seed: int) -> list[list[Any]]:
    runs = []
    for _ in range(2):
        with Job(layout, options, seed) as job:
            job.open()
            runs.append([job.step(s) for s in (1, 2, 3)])
    return runs


@settings(max_examples=4, deadline=None)
@given(layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 2**31))
def test_two_runs_of_one_configuration_match_bit_for_bit(layout: Layout, seed: int) -> None:
    options = {**SMALL, "moe_every": 2, "micro_batches": 2, "batch": 8 * layout.replicas}
    a, b = run_twice(layout, options, seed)
    keys = ("digest", "t", "loss", "compute_s", "comm_wait_s", "bubble_s", "flops")
    assert [[{k: r[k] for k in keys} for r in step] for step in a] == [
        [{k: r[k] for k in keys} for r in step] for step in b
    ]


def test_another_seed_gives_other_parameters() -> None:
    options = {**SMALL, "micro_batches": 2}
    digests = []
    for seed in (1, 2):
        with Job(Layout(tp=2, pp=2), options, seed) as job:
            job.open()
            digests.append([r["digest"] for r in job.step(1)])
    assert digests[0] != digests[1]


@pytest.mark.parametrize(("stages", "micro"), [(1, 3), (2, 4), (4, 4), (4, 2)])
def test_one_f_one_b_schedule(stages: int, micro: int) -> None:
    for stage in range(stages):
        ops = one_f_one_b(stage, stages, micro)
        assert sorted(ops) == sorted([("F", i) for i in range(micro)] + [("B", i) for i in range(micro)])
        in_flight, peak = 0, 0
        for kind, i in ops:
            assert kind == "F" or ("F", i) in ops[: ops.index((kind, i))]
            in_flight += 1 if kind == "F" else -1
            peak = max(peak, in_flight)
        assert peak == min(micro, stages - stage)  # 1F1B keeps at most (stages - stage) in flight


def test_pipeline_bubble_shows_in_virtual_time_and_compute_follows_the_flops() -> None:
    options = {**SMALL, "micro_batches": 4}
    with Job(Layout(pp=2), options, 3) as job:
        job.open()
        job.step(1)  # link set-up on first use lands in step 1
        out = job.step(2)
        preset = job.npus[0].spec.topology.preset
        peak, eff = preset.peak_flops, preset.efficiency
        for rank, r in enumerate(out):
            assert r["flops"] == pytest.approx(job.npus[rank].workload.flops_per_step())
            assert r["compute_s"] == pytest.approx(r["flops"] / (peak * eff))
        assert all(r["bubble_s"] > 0 for r in out)  # stage 1 waits to fill, stage 0 to drain
    with Job(Layout(dp=2), options, 3) as job:
        job.open()
        job.step(1)
        assert [r["bubble_s"] for r in job.step(2)] == [0.0, 0.0]


def test_unsupported_operator_fails_the_step_at_first_use_on_every_rank() -> None:
    options = {**SMALL, "moe_every": 2, "micro_batches": 2}
    with Job(Layout(dp=2, tp=2, pp=2), options, 3, guard_s=10.0) as job:
        job.open()
        job.step(1)
        job.npus[6].set_knob("missing_ops", ["softmax"])  # rank 6: stage 1, whose first block (2) is dense
        out = job.step(2)
    assert all(isinstance(e, UnsupportedOperator) for e in out), out
    direct = [e for e in out if e.fields["how"] == "direct"]
    assert [e.fields["rank"] for e in direct] == [6]
    assert direct[0].fields["op"] == "softmax" and direct[0].fields["layer"] == "block 3 (moe gate)"
    assert "operator 'softmax'" in str(direct[0]) and "rank 6" in str(direct[0])
    assert all(e.fields["origin"] == 6 for e in out if e.fields["how"] == "abort")


def resume_digests(drop: str | None, zero: int = 0) -> tuple[list[str], list[str]]:
    """(digests after step 6 uninterrupted, after resuming at step 3 from every component but ``drop``)."""
    options = {**SMALL, "moe_every": 2, "micro_batches": 2, "zero": zero, "batch": 32}
    layout = Layout(dp=2, tp=2) if zero else Layout(tp=2, pp=2)
    with Job(layout, options, 8) as job:
        job.open()
        job.train(1, 3)
        saved = [{c: n.workload.state(c) for c in COMPONENTS if c != drop} for n in job.npus]
        job.train(4, 6)
        want = [n.workload.params_digest() for n in job.npus]
    with Job(layout, options, 8) as job:
        job.open()
        for npu, comps in zip(job.npus, saved):
            for comp, arrays in comps.items():
                npu.workload.load(comp, arrays)
        job.train(4, 6)
        return want, [n.workload.params_digest() for n in job.npus]


@pytest.mark.parametrize("zero", [0, 1])
def test_a_complete_checkpoint_of_the_cut_model_resumes_bit_for_bit(zero: int) -> None:
    want, got = resume_digests(None, zero)
    assert want == got


@pytest.mark.parametrize("zero", [0, 1])
@pytest.mark.parametrize("component", COMPONENTS)
def test_every_declared_component_of_the_cut_model_matters(component: str, zero: int) -> None:
    want, got = resume_digests(component, zero)
    assert want != got, f"{component} is declared checkpointable but resuming without it changes nothing"


def test_a_large_world_s_checkpoint_barrier_holds_every_rank_until_the_last_arrives(tmp_path: Any) -> None:
    """Past 16 ranks the barrier before a checkpoint runs in the model-parallel group, then in the
    data-parallel replicas (links mostly up already): together they span the world, so no rank
    leaves before the last one arrives, in virtual time."""
    layout = Layout(dp=3, tp=2, pp=3)  # 18 ranks
    job = Job(layout, {"layers": 3, "d_model": 16, "ffn": 32, "batch": 12, "micro_batches": 2}, seed=5)
    try:
        job.open()
        job.train(1, 1)
        late = 17  # the last rank of the last replica and stage
        job.npus[late].clock.advance_to(job.npus[late].clock.t + 50.0)  # arrives 50 s after the rest
        arrival = job.npus[late].clock.t
        out = on_all(job.npus, "save_shard", str(tmp_path), ["params"])
        assert not [o for o in out if isinstance(o, Exception)]
        assert min(n.clock.t for n in job.npus) >= arrival
        assert any(a.startswith("barrier:") for a in job.npus[0].ep.algorithms_run)
    finally:
        job.close()
