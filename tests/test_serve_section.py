"""The scenario's ``serve`` section: parsed, checked, hashed, estimated."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testbed.core.errors import ScenarioError
from testbed.scenario.parse import parse_scenario

ROOT = Path(__file__).resolve().parents[1]
BASE = """\
version: 1
name: serving
cluster: {preset: atlas-900-a3, supernodes: 1, npus_per_supernode: 2}
"""
SERVE = """\
serve:
  model: deepseek-r1-671b
  npus: 160
  precision: int8
  batch: 96
  context: 4096
  slo: {ttft: 2s, tpot: 50ms}
"""


def test_a_serve_section_reads_its_deployment_and_slo() -> None:
    s = parse_scenario(BASE + SERVE)
    assert s.serve is not None
    assert (s.serve.npus, s.serve.batch, s.serve.slo.tpot_s, s.serve.slo.ttft_s) == (160, 96, 0.05, 2.0)
    dep = s.serve.deployment(s.cluster.topology().preset)
    assert dep.precision == "int8" and dep.efficiency == s.cluster.topology().preset.efficiency


def test_a_scenario_without_serving_hashes_as_before_and_serving_changes_the_hash() -> None:
    assert parse_scenario(BASE).serve is None
    assert parse_scenario(BASE).digest() != parse_scenario(BASE + SERVE).digest()
    assert "serve" not in {k for k, v in parse_scenario(BASE).as_dict().items() if v is not None}


def test_a_later_serve_field_at_its_default_hashes_as_before_and_otherwise_changes_the_hash() -> None:
    before = parse_scenario(BASE + SERVE).digest()
    assert parse_scenario(BASE + SERVE + "  ranks_per_instance: 1\n").digest() == before
    assert parse_scenario(
        BASE + SERVE.replace("npus: 160", "npus: 160\n  tp: 2") + "  ranks_per_instance: 2\n"
    ).digest() != (parse_scenario(BASE + SERVE.replace("npus: 160", "npus: 160\n  tp: 2")).digest())


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ("  tp: 3\n", "TP 3 must divide the instance's 160 NPUs"),
        ("  kv_precision: fp4\n", "serve.kv_precision"),
        ("  batch: 0\n", "serve.batch"),
        ("  slo: {tpot: soon}\n", "serve.slo.tpot"),
    ],
)
def test_a_bad_serve_field_is_named_with_its_fix(change: str, named: str) -> None:
    lines = [x for x in SERVE.splitlines(keepends=True) if x.split(":")[0] != change.split(":")[0]]
    with pytest.raises(ScenarioError) as err:
        parse_scenario(BASE + "".join(lines) + change)
    assert named in str(err.value)


def test_estimate_prints_the_serving_picture(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(BASE + SERVE)
    out = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "estimate", str(tmp_path / "s.yaml")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    for part in ("serving: deepseek-r1-671b", "decode at batch 96", "tokens/s per NPU", "TTFT", "KV cache"):
        assert part in out.stdout


@pytest.mark.parametrize(
    ("fault", "named"),
    [
        ("{kind: hang, target: {rank: 0}, at: {time: 2s}}", "hang does not strike a serving run yet"),
        ("{kind: straggler, target: {rank: 0}, at: {step: 2}}", "fires at a virtual time"),
        ("{kind: link_degrade, target: {link: [2, 3]}, at: {time: 2s}}", "reaches no serving instance"),
    ],
)
def test_a_serving_fault_is_refused_unless_it_strikes_an_instance_at_a_time(fault: str, named: str) -> None:
    text = BASE.replace("npus_per_supernode: 2", "npus_per_supernode: 4") + SERVE
    text += "  instances: 2\n  stream: {rate: 1, horizon: 10s}\nfaults:\n  - " + fault + "\n"
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text)
    assert named in str(err.value)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (
            "  ranks_per_instance: 3\n",
            "ranks_per_instance 3 must divide the instance's 160 NPUs and the proxy's",
        ),
        (
            "  ranks_per_instance: 5\n",
            "width 64: the processes stand for the NPUs the model is split over (by TP and EP)",
        ),
        ("  instances: 2\n  ranks_per_instance: 1\n  stream: {rate: 1, horizon: 10s}\n", ""),
        (
            "  tp: 8\n  instances: 2\n  ranks_per_instance: 2\n  stream: {rate: 1, horizon: 10s}\n",
            "need 4 and the cluster has 2",
        ),
        ("  tp: 8\n  ranks_per_instance: 128\n", "serve.ranks_per_instance"),
    ],
)
def test_tp_ranks_must_divide_tp_and_fit_the_cluster(change: str, named: str) -> None:
    if not named:
        assert parse_scenario(BASE + SERVE + change).serve is not None
        return
    with pytest.raises(ScenarioError) as err:
        parse_scenario(BASE + SERVE + change)
    assert named in str(err.value)


def test_a_serving_fault_may_strike_any_rank_of_a_tp_group_and_killing_one_loses_its_instance() -> None:
    text = BASE.replace("npus_per_supernode: 2", "npus_per_supernode: 4") + SERVE
    text += "  tp: 8\n  instances: 2\n  ranks_per_instance: 2\n  stream: {rate: 1, horizon: 10s}\nfaults:\n"
    one = "  - {kind: node_kill, target: {rank: 3}, at: {time: 2s}}\n"
    assert parse_scenario(text + one).faults[0].target == {"rank": 3}
    both = one + "  - {kind: node_kill, target: {rank: 0}, at: {time: 4s}}\n"
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text + both)
    assert "kill all 2 serving instance(s)" in str(err.value)
    beyond = "  - {kind: straggler, target: {rank: 4}, at: {time: 2s}}\n"
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text.replace("npus_per_supernode: 4", "npus_per_supernode: 8") + beyond)
    assert "with R below 4" in str(err.value)


def test_an_autoscale_minimum_above_the_instances_or_beside_training_is_refused() -> None:
    policy = "{min: 3, scale_out_at: 4, startup: 5s, scale_in_after: 10s}"
    scaled = SERVE + f"  instances: 2\n  autoscale: {policy}\n"
    with pytest.raises(ScenarioError) as err:
        parse_scenario(BASE + scaled)
    assert "autoscale.min 3 is more than the 2 instances" in str(err.value)
    ok = parse_scenario(BASE + scaled.replace("min: 3", "min: 1"))
    assert ok.serve is not None and ok.serve.autoscale is not None
    policy_read = ok.serve.autoscale.policy()
    assert policy_read.startup_s == 5.0 and policy_read.scale_in_after_s == 10.0
    with pytest.raises(ScenarioError) as err:
        parse_scenario(BASE + scaled.replace("min: 3", "min: 1") + "  colocation: {policy: priority}\n")
    assert "autoscaling beside training is not modelled yet" in str(err.value)


def test_disaggregated_pools_must_leave_a_decode_instance_and_stand_alone() -> None:
    text = BASE + SERVE + "  instances: 2\n"
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text + "  disaggregation: {prefill: 2}\n")
    assert "2 prefill instance(s) of 2 leave none to decode" in str(err.value)
    ok = parse_scenario(text + "  disaggregation: {prefill: 1}\n")
    assert (
        ok.serve is not None and ok.serve.disaggregation is not None and ok.serve.disaggregation.prefill == 1
    )
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text + "  disaggregation: {prefill: 1}\n  autoscale: {min: 1}\n")
    assert "disaggregated pools with autoscaling or beside training are not modelled yet" in str(err.value)


def test_a_dense_models_ranks_per_instance_stand_for_its_tp_group() -> None:
    dense = "serve:\n  model: llama3-70b\n  npus: 8\n  tp: 4\n  instances: 1\n"
    assert parse_scenario(BASE + dense + "  ranks_per_instance: 2\n").serve is not None
    with pytest.raises(ScenarioError) as err:
        parse_scenario(BASE + dense + "  ranks_per_instance: 8\n")
    assert "ranks_per_instance 8 must divide the instance's 8 NPUs, its TP 4 and the proxy's width 64" in str(
        err.value
    )


def test_a_memory_fragment_strikes_a_serving_instance_at_a_time_for_a_duration() -> None:
    text = BASE.replace("npus_per_supernode: 2", "npus_per_supernode: 4") + SERVE
    text += "  instances: 2\n  stream: {rate: 1, horizon: 10s}\nfaults:\n"
    fault = "  - {kind: memory_fragment, target: {rank: 1}, at: {time: 3s}, block: 64MiB, duration: %s}\n"
    assert parse_scenario(text + fault % "5s").faults[0].params["duration"] == "5s"
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text + fault % "soon")
    assert "duration must be a positive time like 30 or '30s', got 'soon'" in str(err.value)
