"""The job model: parameter counts and FLOPs against published figures, memory, the step, estimate."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.core.errors import ScenarioError
from testbed.job import figures
from testbed.job.estimate import NPU_MTBF_H, estimate
from testbed.job.models import MODELS
from testbed.job.spec import Job
from testbed.scenario.expect import INTEGRITY_KEYS, LATER_EXPECT_KEYS, SERVING_KEYS
from testbed.scenario.parse import parse_scenario
from testbed.topology.layout import Layout
from testbed.topology.presets import PRESETS, Topology
from tests.conftest import ROOT

A3 = PRESETS["atlas-900-a3"]


@pytest.mark.parametrize(
    ("name", "total", "active"),
    [
        # the released checkpoints' parameter counts (model cards), DeepSeek-V3's report
        ("llama3-8b", 8.03e9, 8.03e9),
        ("llama3-70b", 70.6e9, 70.6e9),
        ("llama3-405b", 405.9e9, 405.9e9),
        ("deepseek-v3-671b", 671e9, 37e9),
    ],
)
def test_parameter_counts_match_the_published_ones(name: str, total: float, active: float) -> None:
    m = MODELS[name]
    assert m.params() == pytest.approx(total, rel=0.005)
    assert m.active_params() == pytest.approx(active, rel=0.02)
    assert m.source


def test_llama3_405b_flops_per_token_match_its_published_training_compute() -> None:
    # "3.8 x 10^25 FLOPs" over "15.6T tokens" (The Llama 3 Herd of Models, sections 1 and 3.1.1),
    # which counts 6 N per token: the attention term comes on top of it
    m = MODELS["llama3-405b"]
    six_n = m.flops_per_token(0)
    assert six_n == pytest.approx(3.8e25 / 15.6e12, rel=0.01)
    attention = m.flops_per_token(8192) - six_n
    assert attention == 12 * m.layers * m.heads * m.q_dim * 8192


def _job(**kw: object) -> Job:
    base = dict(
        model=MODELS["llama3-70b"],
        seq=4096,
        global_batch=64,
        micro_batch=1,
        layout=Layout(dp=2, tp=4, pp=2),
        npu=A3,
        efficiency=0.4,
    )
    return Job(**{**base, **kw})  # type: ignore[arg-type]


def test_weights_grads_and_optimizer_per_npu_follow_the_bytes_per_parameter() -> None:
    job = _job()
    first = figures.memory(job)[0]
    per_npu = sum(sum(figures.stage_params(job, s)) for s in range(2))
    assert per_npu * 4 == pytest.approx(MODELS["llama3-70b"].params(), rel=1e-6)  # both stages, tp 4
    assert first.weights == 2 * sum(figures.stage_params(job, 0))
    assert first.grads == 2 * first.weights
    assert first.optimizer == pytest.approx(12 * sum(figures.stage_params(job, 0)) / 2, rel=1e-6)  # dp 2
    whole = figures.memory(_job(distributed_optimizer=False))[0]
    assert whole.optimizer == 2 * first.optimizer


def test_recomputation_and_the_1f1b_schedule_set_the_activations() -> None:
    none, selective, full = (
        figures.memory(_job(recompute=r))[0].activations for r in ("none", "selective", "full")
    )
    assert full < selective < none
    job = _job(layout=Layout(dp=1, tp=4, pp=4), global_batch=16)
    stages = figures.memory(job)
    per_layer = figures.layer_activations(job)
    assert [s.activations for s in stages[:3]] == [
        (4 - i) * s.layers * per_layer for i, s in enumerate(stages[:3])
    ]


def test_a_badly_balanced_pipeline_split_puts_too_much_on_one_stage() -> None:
    balanced = figures.memory(_job())
    skewed = figures.memory(_job(stages=(60, 20)))
    assert max(s.total for s in balanced) < A3.hbm_bytes * 1.01
    assert skewed[0].total > A3.hbm_bytes > skewed[1].total


def test_the_step_is_compute_plus_bubble_plus_each_collective() -> None:
    job = _job()
    st = figures.step_time(job, Topology(A3, 1, 16))
    flops = MODELS["llama3-70b"].flops_per_token(4096) * 64 * 4096 / 16
    assert st.compute_s == pytest.approx(flops / (A3.peak_flops * 0.4))
    assert st.bubble_s == pytest.approx(st.compute_s * (2 - 1) / 32)
    names = {c.name: c for c in st.collectives}
    assert set(names) == {"tp_allreduce", "pp_send", "dp_grad_allreduce"}  # no EP, no experts
    tp = names["tp_allreduce"]
    assert (tp.count, tp.nbytes, tp.group) == (4 * 40 * 32, 2 * 4096 * 8192, 4)
    # four ranks in one supernode, a large message: a ring, 2(p-1) a + 2(p-1)/p n/B each
    ring = 2 * 3 * A3.intra.latency_s + 2 * 3 / 4 * tp.nbytes / A3.intra.bandwidth_Bps
    assert tp.algo == "ring" and tp.seconds == pytest.approx(tp.count * ring)
    assert st.total_s == pytest.approx(st.compute_s + st.bubble_s + sum(c.seconds for c in st.collectives))
    across = figures.step_time(_job(layout=Layout(dp=2, tp=8)), Topology(A3, 2, 8))
    assert {c.name: c.link for c in across.collectives}["dp_grad_allreduce"] == "inter"


def test_experts_bring_an_all_to_all_and_shard_over_ep() -> None:
    job = _job(model=MODELS["deepseek-v3-671b"], layout=Layout(dp=2, tp=1, pp=4, ep=8), global_batch=64)
    st = figures.step_time(job, Topology(A3, 1, 64))
    (a2a,) = [c for c in st.collectives if c.name == "ep_alltoall"]
    assert a2a.group == 8 and a2a.nbytes == 2 * 4096 * 7168 * 8
    experts = figures.stage_params(job, 1)[1]
    assert experts == 15 * 256 * MODELS["deepseek-v3-671b"].expert_params() // 8  # 15 MoE layers, EP 8


def test_young_daly_interval_and_goodput() -> None:
    e = estimate(_job(), Topology(A3, 1, 16), restart_s=45.0)
    assert e.mtbf_s == pytest.approx(NPU_MTBF_H * 3600 / 16)
    assert e.interval_s == pytest.approx(math.sqrt(2 * e.checkpoint_write_s * e.mtbf_s))
    assert 0.9 < e.goodput < 1.0
    big = estimate(
        dataclasses.replace(_job(), layout=Layout(dp=1024, tp=4, pp=4)), Topology(A3, 43, 384), 45.0
    )
    assert big.mtbf_s < e.mtbf_s and big.goodput < e.goodput
    assert 0 < e.mfu < 0.4


SCENARIO = """\
version: 1
name: job
cluster: {preset: atlas-900-a3, supernodes: 1, npus_per_supernode: 16}
workload: {name: transformer, steps: 4, parallel: {tp: 4, pp: 2, dp: 2}}
job: {model: llama3-70b, seq: 4096, global_batch: 64, recompute: full}
"""


def test_a_job_section_is_checked_where_it_is_written() -> None:
    assert parse_scenario(SCENARIO).job is not None
    with pytest.raises(ScenarioError) as bad:
        parse_scenario(SCENARIO.replace("global_batch: 64", "global_batch: 63"))
    assert "job.global_batch" in str(bad.value) and "multiple of 2" in str(bad.value)
    with pytest.raises(ScenarioError) as unknown:
        parse_scenario(SCENARIO.replace("llama3-70b", "llama3-71b"))
    assert "job.model" in str(unknown.value) and "llama3-70b" in str(unknown.value)


def test_a_pipeline_split_that_does_not_fit_fails_validation_naming_the_stage_and_the_fix() -> None:
    skewed = SCENARIO.replace("recompute: full}", "recompute: full, stages: [60, 20]}")
    with pytest.raises(ScenarioError) as bad:
        parse_scenario(skewed)
    text = str(bad.value)
    assert "job.stages" in text and "out of memory: pipeline stage 0 (60 layers) needs" in text
    assert "an NPU of atlas-900-a3 has 119.2 GiB" in text and "stages: [40, 40], which fits" in text
    assert "stage 1" not in text  # the other stage fits
    assert parse_scenario(SCENARIO.replace("recompute: full}", "recompute: full, stages: [40, 40]}")).job
    with pytest.raises(ScenarioError) as short:
        parse_scenario(SCENARIO.replace("recompute: full}", "recompute: full, stages: [40, 30]}"))
    assert "add up to 80" in str(short.value)


def test_estimate_prints_the_picture_and_refuses_a_scenario_without_a_job(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(SCENARIO)
    (tmp_path / "nojob.yaml").write_text(SCENARIO.split("job:")[0])
    cli = [sys.executable, "-m", "testbed.cli", "estimate"]
    ok = subprocess.run(
        [*cli, str(tmp_path / "job.yaml")], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert ok.returncode == 0, ok.stderr
    for part in (
        "step:",
        "compute",
        "pipeline bubble",
        "tp_allreduce",
        "stage 0",
        "checkpoint:",
        "MTBF",
        "goodput",
    ):
        assert part in ok.stdout
    none = subprocess.run(
        [*cli, str(tmp_path / "nojob.yaml")], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert none.returncode == 254 and "no job or serve section" in none.stderr
    assert "Traceback" not in none.stderr


RUN = """\
version: 1
name: jobrun
seed: 3
cluster: {preset: atlas-900-a3, supernodes: 1, npus_per_supernode: 2}
workload: {name: mlp, steps: 4, parallel: {dp: 2}}
policy: {checkpoint: {every: 2}}
job: {model: llama3-8b, seq: 4096, global_batch: 64, recompute: full}
"""


@pytest.mark.ray
def test_a_run_takes_the_jobs_compute_per_step_and_checkpoint_bytes(testbed_run: Any) -> None:
    result = testbed_run(parse_scenario(RUN))
    assert result.verdict == "pass"
    events = [json.loads(x) for x in (result.out_dir / "journal.jsonl").read_text().splitlines()]
    (job,) = [e for e in events if e["event"] == "job"]
    expected = MODELS["llama3-8b"].flops_per_token(4096) * 64 * 4096 / 2
    assert job["flops_per_npu_step"] == pytest.approx(expected)
    compute_s = expected * 4 / 3 / (A3.peak_flops * A3.efficiency)  # full recomputation: a forward more
    assert job["estimate"]["compute_s"] == pytest.approx(compute_s)
    steps = [e for e in events if e["event"] == "step_end" and e["phase"] == "main"]
    assert all(c == pytest.approx(compute_s, rel=1e-9) for e in steps for c in e["compute_s"])
    params = MODELS["llama3-8b"].params()
    assert job["checkpoint_components"] == {"params": 2 * params, "optimizer": 12 * params}
    # the gradient allreduce moved the proxy's bytes but took the job's time: the run agrees with
    # the estimate part by part
    (sync,) = job["estimate"]["collectives"].values()
    assert (
        sync["nbytes"] == 4 * params
        and job["job_scale"]["replica"]["job_bytes_per_call"]["min"] == 4 * params
    )
    compared = result.data["against_estimate"]
    assert compared["agrees"], compared
    assert {r["part"] for r in compared["rows"]} == {
        "step",
        "compute",
        "collectives",
        "bubble",
        "checkpoint write",
    }
    assert all(r["ratio"] == pytest.approx(1.0, abs=0.05) for r in compared["rows"])
    assert "against the estimate" in result.summary()
    for ckpt in (e for e in events if e["event"] == "checkpoint_committed"):
        small = sum(
            entry["bytes"]
            for shard in json.loads((Path(ckpt["path"]) / "manifest.json").read_text())["ranks"].values()
            for name, entry in shard.items()
            if name not in ("params", "optimizer")
        )
        assert ckpt["write_s"] == pytest.approx((14 * params + small) / A3.storage_Bps)


def test_a_job_section_changes_the_scenarios_digest_and_its_absence_leaves_it_as_before() -> None:
    with_job = parse_scenario(SCENARIO)
    without = parse_scenario(SCENARIO.split("job:")[0])
    assert with_job.digest() != without.digest()
    unhashed = ("file", "warnings", "lines", "job", "serve", "overrides")
    body = {k: v for k, v in without.as_dict().items() if k not in unhashed}
    # the body as it was before serving, integrity, preemption, fencing and reference_run: its expect
    # without their keys, no integrity or preemption policy, no checkpoint fencing
    later = (*SERVING_KEYS, *INTEGRITY_KEYS, *LATER_EXPECT_KEYS)
    body["expect"] = {k: v for k, v in body["expect"].items() if k not in later}
    body["policy"] = {k: v for k, v in body["policy"].items() if k not in ("integrity", "preemption")}
    body["policy"]["checkpoint"] = {k: v for k, v in body["policy"]["checkpoint"].items() if k != "fencing"}
    assert (
        without.digest() == hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()
    )
    # a job field added later (its own cluster), left at its default, hashes as before it existed
    body["job"] = {k: v for k, v in with_job.as_dict()["job"].items() if k != "cluster"}
    hashed = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()
    assert with_job.digest() == hashed


PIPELINE = """\
version: 1
name: jobpipe
seed: 5
cluster: {preset: atlas-900-a3, supernodes: 1, npus_per_supernode: 4}
workload: {name: transformer, steps: 6, parallel: {tp: 2, pp: 2}, layers: 4, d_model: 32, ffn: 64,
  batch: 8, micro_batches: 2}
policy: {checkpoint: {every: 3}}
job: {model: llama3-8b, seq: 4096, global_batch: 16, micro_batch: 1, virtual_stages: 2}
"""


@pytest.mark.ray
def test_a_pipelined_run_times_tp_and_pp_at_the_jobs_sizes_and_names_its_bubble(testbed_run: Any) -> None:
    result = testbed_run(parse_scenario(PIPELINE))
    assert result.verdict == "pass"
    rows = {r["part"]: r for r in result.data["against_estimate"]["rows"]}
    assert rows["compute"]["agrees"] and rows["collectives"]["agrees"], rows
    # the proxy pipelines 2 micro-batches in plain 1F1B, the job 16 over 2 chunks a rank: the run
    # waits the job's bubble, 1/32 of the compute (and its sends), not the proxy's 1/2
    bubble = rows["bubble"]
    assert bubble["agrees"] and rows["step"]["agrees"], rows
    events = [json.loads(x) for x in (result.out_dir / "journal.jsonl").read_text().splitlines()]
    (job,) = [e for e in events if e["event"] == "job"]
    assert job["estimate"]["virtual_stages"] == 2 and job["pipeline"] == "job"
    assert bubble["run_s"] < rows["compute"]["run_s"] / 16


def test_a_ranks_traffic_is_the_jobs_collectives_at_its_stage() -> None:
    job = _job(layout=Layout(dp=2, tp=4, pp=2))
    act = 2 * 4096 * 1 * 8192
    m = job.micro_batches
    first, last = figures.rank_traffic(job, 0), figures.rank_traffic(job, 1)
    assert first["tp"] == (4 * 40 * m * act, 4 * 40 * m)
    # the first stage sends activations, the last gradients; each TP rank its 1/t of them
    assert first["pp"] == last["pp"] == (m * act // 4, m)
    assert first["replica"] == (4 * figures.stage_params(job, 0)[0], 1)
    assert "ep" not in first and "dp" not in first  # no experts
    deep = _job(layout=Layout(dp=1, tp=4, pp=4))
    assert figures.rank_traffic(deep, 1)["pp"] == (2 * deep.micro_batches * act // 4, 2 * deep.micro_batches)


def _journal(
    compute: float = 10.0, comm: float = 0.5, bubble: float = 0.0, micro: int = 1
) -> list[dict[str, Any]]:
    est = {
        "step_s": 10.5,
        "compute_s": 10.0,
        "comm_s": 0.5,
        "bubble_s": 0.0,
        "micro_batches": 1,
        "checkpoint_write_s": 2.0,
    }
    step = {
        "event": "step_end",
        "phase": "main",
        "compute_s": [compute, compute],
        "comm_wait_s": [comm, comm],
        "bubble_s": [bubble, bubble],
    }
    steps = [dict(step, step=i, t_start=20.0 * i, t=20.0 * i + compute + comm + bubble) for i in range(1, 6)]
    ckpt = {"event": "checkpoint_committed", "phase": "main", "write_s": 2.0}
    return [{"event": "job", "estimate": est, "proxy_micro_batches": micro}, *steps, ckpt]


def test_the_run_beside_its_estimate_agrees_or_names_the_difference() -> None:
    from testbed.report.against_estimate import against_estimate, render

    assert against_estimate(_journal())["agrees"]
    assert against_estimate([e for e in _journal() if e["event"] != "job"]) is None
    slow = against_estimate(_journal(compute=11.0))  # 10 % more compute than the closed forms say
    rows = {r["part"]: r for r in slow["rows"]}
    assert not slow["agrees"] and rows["compute"]["why"].startswith("not explained")
    assert rows["step"]["why"] == "follows from the parts above" and rows["collectives"]["agrees"]
    near = against_estimate(_journal(compute=10.4))  # within 5 %
    assert near["agrees"]
    piped = against_estimate(_journal(bubble=2.0, micro=4))
    (bubble,) = [r for r in piped["rows"] if r["part"] == "bubble"]
    assert "the proxy pipelines 4 micro-batches per step, the job 1" in bubble["why"]
    assert any("DIFFERS" in line for line in render(slow)) and not any("DIFFERS" in x for x in render(near))


def test_full_recomputation_computes_the_forward_pass_again_but_counts_no_more_model_flops() -> None:
    none, full = _job(recompute="selective"), _job(recompute="full")
    topo = Topology(A3, 1, 16)
    assert figures.step_time(full, topo).compute_s == pytest.approx(
        figures.step_time(none, topo).compute_s * 4 / 3
    )
    assert figures.flops_per_npu(full) == figures.flops_per_npu(none)  # MFU counts the model's


ZERO = """\
version: 1
name: jobzero
seed: 5
cluster: {preset: atlas-900-a3, supernodes: 1, npus_per_supernode: 2}
workload: {name: transformer, steps: 3, parallel: {dp: 2}, layers: 2, d_model: 32, ffn: 64, batch: 8,
  micro_batches: 1, zero: 1}
policy: {checkpoint: {every: 0}}
job: {model: llama3-8b, seq: 4096, global_batch: 16, micro_batch: 1}
"""


@pytest.mark.ray
def test_a_sharded_optimizers_reduce_scatter_and_allgather_together_take_the_jobs_one_allreduce(
    testbed_run: Any,
) -> None:
    result = testbed_run(parse_scenario(ZERO))
    rows = {r["part"]: r for r in result.data["against_estimate"]["rows"]}
    assert rows["collectives"]["agrees"], rows["collectives"]  # not twice the estimate
    assert rows["collectives"]["run_s"] > 0


def test_the_kv_cache_per_token_is_the_shapes_keys_and_values() -> None:
    """Llama 3 8B caches 2 x 32 layers x 8 KV heads x 128 values a token (128 KiB in BF16); DeepSeek-V3's
    latent attention 61 layers x (512 + 64), about 69 KiB."""
    assert MODELS["llama3-8b"].kv_values_per_token() * 2 == 128 * 2**10
    assert MODELS["llama3-70b"].kv_values_per_token() == 2 * 80 * 8 * 128
    assert MODELS["deepseek-v3-671b"].kv_values_per_token() == 61 * (512 + 64)


def test_the_estimate_takes_the_scenarios_own_failure_process_when_it_gives_one() -> None:
    from testbed.job.estimate import job_mtbf_s, render
    from testbed.scenario.job_estimate import scenario_estimate, scenario_mtbf_s

    kills = (
        "faults:\n"
        "  - {kind: node_kill, target: {mode: random}, at: {mtbf: 1h}}\n"
        "  - {kind: node_kill, target: {mode: random}, at: {mtbf: 2h}}\n"
    )
    two = parse_scenario(SCENARIO + kills)
    assert scenario_mtbf_s(two) == pytest.approx(2400.0)  # rates add: 1/(1/3600 + 1/7200)
    e = scenario_estimate(two)
    assert e is not None and e.mtbf_s == pytest.approx(2400.0) and e.mtbf_from == "scenario"
    line = next(x for x in render(e).splitlines() if x.startswith("failures:"))
    assert line.startswith("failures: MTBF 0.67 h, as the scenario's faults give (the job's size would give")
    job_rate = parse_scenario(
        SCENARIO + "faults:\n  - {kind: node_kill, target: {mode: random}, at: {mtbf: job}}\n"
    )
    e = scenario_estimate(job_rate)
    assert e is not None and e.mtbf_s == job_mtbf_s(e.job)
    assert "failures: MTBF" in render(e) and "as the scenario's faults give" not in render(e)
    plain = scenario_estimate(parse_scenario(SCENARIO))  # no failure process: the job's size
    assert (
        plain is not None and plain.mtbf_from == "job" and scenario_mtbf_s(parse_scenario(SCENARIO)) is None
    )
