"""The interleaved pipeline schedule: ``v`` model chunks per rank cut the bubble ``v``-fold, keep
more activations in flight and send ``v`` times as often (Narayanan et al. 2021, section 2.2.2;
Korthikanti et al. 2022, section 4.2.3)."""

from __future__ import annotations

import pytest

from testbed.core.errors import ScenarioError
from testbed.job import figures
from testbed.job.estimate import estimate, render
from testbed.job.spec import Job
from testbed.report.against_estimate import against_estimate
from testbed.scenario.parse import parse_scenario
from testbed.topology.layout import Layout
from testbed.topology.presets import PRESETS, Topology
from tests.test_job import _job as job_of

A3 = PRESETS["atlas-900-a3"]


def _job(v: int = 1, **kw: object) -> Job:
    """Llama 3 70B at TP 8 x PP 4 (20 layers a stage), 32 micro-batches, ``v`` chunks a rank."""
    return job_of(**{"global_batch": 32, "layout": Layout(dp=1, tp=8, pp=4), "virtual_stages": v, **kw})


def test_the_bubble_shrinks_v_fold_and_the_sends_grow_with_the_chunks() -> None:
    topo = Topology(A3, 1, 32)
    plain, inter = figures.step_time(_job(1), topo), figures.step_time(_job(4), topo)
    p, m = 4, 32
    assert plain.bubble_s == pytest.approx(plain.compute_s * (p - 1) / m)
    assert inter.bubble_s == pytest.approx(inter.compute_s * (p - 1) / (4 * m))
    assert inter.compute_s == plain.compute_s
    sends = (
        {c.name: c for c in plain.collectives}["pp_send"],
        {c.name: c for c in inter.collectives}["pp_send"],
    )
    assert (sends[0].count, sends[1].count) == (2 * (m + p - 1), 2 * (4 * m + p - 1))
    assert sends[0].nbytes == sends[1].nbytes == 2 * 4096 * 8192 // 8  # each TP rank its 1/t
    # every rank but the pipeline's two ends sends forward and back for each of its chunks
    job = _job(4)
    assert [figures.rank_traffic(job, s)["pp"][1] for s in range(p)] == [7 * m, 8 * m, 8 * m, 7 * m]


def test_interleaving_keeps_korthikantis_factor_more_activations_on_the_first_stage() -> None:
    p, per_layer = 4, figures.layer_activations(_job())
    layers = 80  # the model's: 20 a stage, p micro-batches of them in flight on the first under 1F1B
    assert figures.memory(_job(1))[0].activations == per_layer * layers
    for v in (2, 4):
        first = figures.memory(_job(v))[0]
        assert first.activations == pytest.approx(per_layer * layers * (1 + (p - 1) / (p * v)))
    # a stage further down holds fewer; never more chunks than the step has
    assert figures.in_flight_layers(_job(2), 3) < figures.in_flight_layers(_job(2), 0)
    few = _job(4, global_batch=1)  # one micro-batch: 4 chunks of 5 layers at most
    assert figures.in_flight_layers(few, 0) == 20


SCENARIO = """\
version: 1
name: interleaved
cluster: {preset: atlas-900-a3, supernodes: 1, npus_per_supernode: 16}
workload: {name: transformer, steps: 4, parallel: {tp: 4, pp: 2, dp: 2}}
job: {model: llama3-70b, seq: 4096, global_batch: 64, recompute: full, virtual_stages: 4}
"""


def test_a_scenario_names_its_chunks_and_is_refused_a_chunk_without_a_layer() -> None:
    job = parse_scenario(SCENARIO).job
    assert job is not None and job.virtual_stages == 4
    with pytest.raises(ScenarioError) as bad:
        parse_scenario(SCENARIO.replace("virtual_stages: 4", "virtual_stages: 41"))
    assert "job.virtual_stages" in str(bad.value) and "give at most 40" in str(bad.value)
    flat = SCENARIO.replace("tp: 4, pp: 2, dp: 2", "tp: 4, pp: 1, dp: 4")
    with pytest.raises(ScenarioError) as nopipe:
        parse_scenario(flat)
    assert "need a pipeline" in str(nopipe.value) and "virtual_stages: 1" in str(nopipe.value)
    with pytest.raises(ScenarioError) as zero:
        parse_scenario(SCENARIO.replace("virtual_stages: 4", "virtual_stages: 0"))
    assert "job.virtual_stages" in str(zero.value)


def test_an_interleaved_split_that_fits_only_plain_is_told_so() -> None:
    # TP 4 x PP 4 at sequence 8192: 118.6 GiB on stage 0 under 1F1B, 134.6 GiB with two chunks
    tight = SCENARIO.replace("tp: 4, pp: 2, dp: 2", "tp: 4, pp: 4, dp: 1").replace(
        "seq: 4096, global_batch: 64, recompute: full, virtual_stages: 4",
        "seq: 8192, global_batch: 64, recompute: selective, virtual_stages: 2",
    )
    with pytest.raises(ScenarioError) as bad:
        parse_scenario(tight)
    text = str(bad.value)
    assert "out of memory: pipeline stage 0 (20 layers) needs 134.6 GiB" in text
    assert "virtual_stages: 1 (interleaving keeps more activations in flight), which fits" in text
    assert parse_scenario(tight.replace("virtual_stages: 2", "virtual_stages: 1")).job is not None


def test_the_estimate_prints_the_interleaved_bubble_and_the_run_names_its_plain_one() -> None:
    e = estimate(_job(4), Topology(A3, 1, 32), restart_s=45.0)
    assert "(p-1)/(v m) = 3/(4 x 32), interleaved" in render(e)
    est = {
        "step_s": 10.5,
        "compute_s": 10.0,
        "comm_s": 0.5,
        "bubble_s": 0.1,
        "micro_batches": 4,
        "virtual_stages": 4,
        "checkpoint_write_s": 2.0,
    }
    step = {
        "event": "step_end",
        "phase": "main",
        "compute_s": [10.0],
        "comm_wait_s": [0.5],
        "bubble_s": [0.4],
    }
    events = [{"event": "job", "estimate": est, "proxy_micro_batches": 4}]
    events += [dict(step, step=i, t_start=20.0 * i, t=20.0 * i + 10.9) for i in range(1, 4)]
    rows = {r["part"]: r for r in against_estimate(events)["rows"]}
    assert not rows["bubble"]["agrees"]
    assert rows["bubble"]["why"] == (
        "the proxy runs plain 1F1B, the job interleaves 4 model chunks per rank: "
        "the bubble is (p-1)/(v m) of the compute"
    )


def test_each_stage_holds_megatrons_warm_up_of_chunks() -> None:
    p, v, m = 4, 2, 32
    job = _job(v)
    for stage in range(p):
        chunks = min((v - 1) * p + 2 * (p - stage - 1) + 1, v * m)
        assert figures.in_flight_layers(job, stage) == chunks * 20 / v  # 20 layers a stage
    assert [figures.in_flight_layers(_job(1), s) for s in range(p)] == [80.0, 60.0, 40.0, 20.0]


def test_micro_batches_must_come_in_whole_rounds_of_the_pipeline_to_interleave() -> None:
    uneven = SCENARIO.replace("global_batch: 64", "global_batch: 6")  # 3 micro-batches a pipeline, pp 2
    with pytest.raises(ScenarioError) as bad:
        parse_scenario(uneven)
    assert "job.virtual_stages" in str(bad.value) and "whole rounds of pp 2" in str(bad.value)
    assert parse_scenario(uneven.replace("virtual_stages: 4", "virtual_stages: 1")).job is not None


def test_the_wrap_around_sends_are_timed_on_the_link_they_cross() -> None:
    """TP 8 x PP 4 over two supernodes of 16: stages 0-1 in one, 2-3 in the other. Interleaved, the
    first stage also exchanges with the last, across the supernodes."""
    topo = Topology(A3, 2, 16)
    plain, inter = _job(1), _job(4)
    assert figures.pp_sends(inter, 0) == (4 * 32, 3 * 32) and figures.pp_sends(inter, 3) == (3 * 32, 4 * 32)
    assert figures.pp_sends(_job(1, layout=Layout(dp=1, tp=8, pp=1)), 0) == (0, 0)
    one = figures.rank_collectives(plain, 0, topo)["pp"]
    four = figures.rank_collectives(inter, 0, topo)["pp"]
    per_call = four.per_call
    nxt = figures.closed_form.send_split_s(0, 8, topo, per_call)  # stage 1, inside
    wrap = figures.closed_form.send_split_s(0, 24, topo, per_call)  # stage 3, across
    assert four.transfer_s == pytest.approx(128 * nxt[1] + 96 * wrap[1])
    assert four.transfer_s / four.calls > 2 * one.transfer_s / one.calls  # the across link is slower
    sends = {c.name: c for c in figures.step_time(inter, topo).collectives}["pp_send"]
    assert sends.link == f"{A3.inter.name} and {A3.intra.name}"
