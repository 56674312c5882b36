"""A pipelined proxy takes its job's pipeline: whatever stages and micro-batches the proxy has, its
step lasts what the job's estimate says (the bubble ``(p - 1) / (v m)`` of the compute, Narayanan
et al. 2021), while its own 1F1B schedule still runs for real (testbed.job.pipeline)."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

import pytest

from testbed.job import figures
from testbed.job.models import MODELS
from testbed.job.pipeline import due_s, pipeline_waits, stage_idle
from testbed.job.spec import Job
from testbed.report.against_estimate import against_estimate
from testbed.scenario.parse import parse_scenario
from testbed.topology.layout import Layout
from testbed.topology.presets import PRESETS, Topology
from testbed.train.npu import NPU
from testbed.train.rank_spec import RankSpec
from tests.ranks import on_all
from workloads import WORKLOADS

A3 = PRESETS["atlas-900-a3"]
#: Llama 3 70B at TP 8 x PP 8 x DP 8, 64 micro-batches a pipeline (the issue's job)
JOB = Job(MODELS["llama3-70b"], 4096, 512, 1, Layout(dp=8, tp=8, pp=8), A3, 0.4, "full")


def _steps(job: Job, layout: Layout, micro: int, steps: int = 4) -> list[float]:
    """The steps of a proxy of ``layout`` pipelining ``micro`` micro-batches for ``job``, on threads
    (no Ray): each the span from the first rank's start to the last rank's end."""
    world = layout.world
    topo = Topology(A3, 2, world // 2)
    options = {"layers": 4, "d_model": 16, "ffn": 32, "batch": 2 * micro * layout.replicas, "steps": steps}
    options["micro_batches"] = micro
    spec = RankSpec(
        topo,
        seed=3,
        workload_factory=WORKLOADS["transformer"].factory,
        workload_options=options,
        connect_timeout_s=120.0,
        exec_timeout_s=1836.0,
        guard_s=20.0,
        layout=layout,
        job=job,
    )
    npus = [NPU(r, spec) for r in range(world)]
    try:
        addresses = {r: list(n.dataplane.address) for r, n in enumerate(npus)}
        for out in on_all(npus, "open_group", 0, addresses, 0.0):
            assert not isinstance(out, Exception), out
        spans = []
        for step in range(1, steps + 1):
            out = on_all(npus, "train_step", step)
            for o in out:
                assert not isinstance(o, Exception), o
            spans.append(max(o["t"] for o in out) - min(o["t_start"] for o in out))
        return spans
    finally:
        on_all(npus, "close")


def _estimate(job: Job, run: Topology) -> float:
    return figures.step_time(job, figures.job_topology(job, run)).total_s


SHAPES = [
    # (proxy layout, proxy micro-batches, job): fewer stages and micro-batches than the job, as
    # many, more micro-batches than the job has, interleaved
    (Layout(dp=2, tp=2, pp=2), 2, JOB),
    (Layout(dp=2, tp=2, pp=2), 1, JOB),
    (Layout(dp=2, tp=2, pp=2), 5, JOB),
    (Layout(dp=2, tp=1, pp=4), 3, dataclasses.replace(JOB, layout=Layout(dp=8, tp=1, pp=8))),
    (Layout(dp=2, tp=2, pp=2), 2, dataclasses.replace(JOB, virtual_stages=2)),
    (Layout(dp=2, tp=2, pp=4), 2, dataclasses.replace(JOB, virtual_stages=5)),
    (Layout(dp=2, tp=2, pp=2), 4, dataclasses.replace(JOB, global_batch=16)),  # the job's m is 2
    (Layout(dp=2, tp=2, pp=4), 8, dataclasses.replace(JOB, layout=Layout(dp=8, tp=8, pp=4))),
]


@pytest.mark.parametrize(("layout", "micro", "job"), SHAPES)
def test_a_proxys_steady_step_is_its_jobs_estimate_whatever_its_pipeline(
    layout: Layout, micro: int, job: Job
) -> None:
    spans = _steps(job, layout, micro)
    estimate = _estimate(job, Topology(A3, 2, layout.world // 2))
    assert spans[-1] == pytest.approx(estimate, rel=0.02), (spans, estimate)
    assert spans[-2] == pytest.approx(estimate, rel=0.02), (spans, estimate)


def test_every_stage_waits_the_jobs_bubble_and_sends_and_a_death_falls_inside_the_step() -> None:
    topo = figures.job_topology(JOB, Topology(A3, 2, 4))
    step = figures.step_time(JOB, topo)
    compute = step.compute_s
    p, m = 8, 64
    for stage in range(p):
        idle = stage_idle(JOB, stage, compute)
        assert sum(s for _, s in idle) == pytest.approx(compute * (p - 1) / m)
        assert [at for at, _ in idle] == sorted(at for at, _ in idle)
        waits = pipeline_waits(JOB, topo, stage)
        assert waits.total_s == pytest.approx(step.bubble_s + step.collectives[1].seconds)
        # waited piece by piece as the compute goes (never more than the whole), the rest at the end
        charged = 0.0
        for done in (0.0, 0.1, 0.5, 0.9):
            dt = due_s(waits, done * waits.flops, charged)
            assert dt >= 0
            charged += dt
            assert charged <= waits.total_s + 1e-12
        charged += due_s(waits, waits.flops, charged, end=True)
        assert charged == pytest.approx(waits.total_s)
    # the last stage waits for the first forward to reach it; the first waits nothing before computing
    assert stage_idle(JOB, 7, compute)[0][1] > 0 == stage_idle(JOB, 0, compute)[0][1]
    # interleaving cuts the bubble v-fold
    inter = dataclasses.replace(JOB, virtual_stages=2)
    assert sum(s for _, s in stage_idle(inter, 0, compute)) == pytest.approx(compute * (p - 1) / (2 * m))


def test_the_run_beside_its_estimate_agrees_for_a_job_timed_pipeline() -> None:
    est = {"step_s": 10.0, "compute_s": 8.0, "comm_s": 1.0, "bubble_s": 1.0, "micro_batches": 64}
    est["checkpoint_write_s"] = 2.0
    step = {"event": "step_end", "phase": "main", "compute_s": [8.0], "comm_wait_s": [1.0], "bubble_s": [1.0]}
    events: list[dict[str, Any]] = [
        {"event": "job", "estimate": est, "proxy_micro_batches": 2, "pipeline": "job"}
    ]
    events += [dict(step, step=i, t_start=20.0 * i, t=20.0 * i + 10.0) for i in range(1, 4)]
    rows = {r["part"]: r for r in against_estimate(events)["rows"]}
    assert rows["bubble"]["agrees"] and rows["step"]["agrees"]
    events[0]["pipeline"] = None  # a journal written before: the proxy's own bubble is named
    late = [dict(e, bubble_s=[3.0], t=e["t"] + 2.0) if e["event"] == "step_end" else e for e in events]
    rows = {r["part"]: r for r in against_estimate(late)["rows"]}
    assert "the proxy pipelines 2 micro-batches per step, the job 64" in rows["bubble"]["why"]


H11 = """\
version: 1
name: h11
seed: 5
cluster: {preset: atlas-900-a3, supernodes: 2, npus_per_supernode: 4}
workload: {name: transformer, steps: 5, parallel: {tp: 2, pp: 2, dp: 2}, layers: 4, d_model: 16, ffn: 32,
           batch: 8, micro_batches: 2}
job: {model: llama3-70b, seq: 4096, global_batch: 512, recompute: full, parallel: {tp: 8, pp: 8, dp: 8}}
"""


def test_a_run_of_the_issues_job_agrees_with_its_estimate_step_and_bubble(testbed_run: Any) -> None:
    report = testbed_run(parse_scenario(H11))
    assert report.verdict != "fail"
    rows = {r["part"]: r for r in report.data["against_estimate"]["rows"]}
    for part in ("step", "compute", "bubble", "collectives"):
        assert rows[part]["agrees"], rows[part]
    assert rows["step"]["ratio"] == pytest.approx(1.0, abs=0.02)
    steps = [e["t"] - e["t_start"] for e in report.events() if e.get("event") == "step_end"]
    assert statistics.median(steps) == pytest.approx(rows["step"]["estimate_s"], rel=0.02)
