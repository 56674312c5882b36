"""Serving runs on the session's Ray: instances on TP groups of NPU processes, a real SIGKILL
mid-decode of one rank of a group, the named KV OOM in the verdict, determinism by seed, and the run
equal to the same fleet served whole in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.actors.rank_signals import process_gone
from testbed.control.runner import run
from testbed.control.serve_run import _config, instance_kills, kv_blocks
from testbed.core.journal import deterministic_view, read_journal
from testbed.report.run_report import Report
from testbed.scenario.parse import load_scenario, parse_scenario
from testbed.serve.fleet import Fleet
from testbed.serve.requests import generate
from tests.conftest import SCENARIOS

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

SERVING = """\
version: 1
name: serving_small
seed: {seed}
cluster: {{preset: atlas-800t-a2, supernodes: 1, npus_per_supernode: {npus}}}
policy: {{detection: {{heartbeat_s: 1, missed: 2}}}}
serve:
  model: llama3-8b
  npus: {tp}
  tp: {tp}
  ranks_per_instance: {tp}
  instances: 2
  batch: 32
  kv_blocks: {blocks}
  preemption: {preemption}
  slo: {{ttft: 3s, tpot: 100ms}}
  stream:
    rate: 3
    horizon: 8s
    prompt: {{kind: uniform, low: 64, high: 512}}
    output: {{kind: uniform, low: 16, high: 128}}
    bursts: [{{at: 3s, count: 6, prompt: {{low: 3000}}, output: {{low: 256}}}}]
faults: {faults}
expect: {{lost_requests: 0, tokens_identical: true}}
"""
#: rank 1: the second rank of instance0's TP group of two
KILL = "[{kind: node_kill, target: {rank: 1}, at: {time: 4s}}]"
TP = {"tp": 2, "npus": 4}


def serving_text(seed: int = 3, faults: str = KILL, **kw: object) -> str:
    fields = {"blocks": 100000, "preemption": "recompute", **TP, **kw}
    return SERVING.format(seed=seed, faults=faults, **fields)


def serving(tmp_path: Path, name: str, seed: int = 3, faults: str = KILL, **kw: object) -> Report:
    return run(parse_scenario(serving_text(seed, faults, **kw), f"{name}.yaml"), tmp_path / name)


def events(result: Report, name: str) -> list[dict[str, object]]:
    return [e for e in read_journal(result.out_dir / "journal.jsonl") if e["event"] == name]


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Report:
    """The small serving scenario, two instances on TP groups of two processes, with rank 1 (of
    instance0) SIGKILLed at 4 s: one run, several tests."""
    return serving(tmp_path_factory.mktemp("serving"), "kill")


def test_one_rank_of_a_tp_group_sigkilled_mid_decode_loses_its_instance_and_no_request_or_token(
    killed: Report,
) -> None:
    result = killed
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    (start,) = events(result, "serve_start")
    assert start["groups"] == {"instance0": [0, 1], "instance1": [2, 3]}
    (lost,) = events(result, "instance_lost")
    assert lost["instance"] == "instance0" and lost["point"] == "decode" and lost["gone"] is True
    assert lost["rank"] == 1 and lost["peers"] == {"0": "PeerLost"}  # its peer's allreduce met the death
    assert process_gone(int(lost["pid"]))  # type: ignore[call-overload]
    assert lost["at_s"] == 4.0 and lost["detected_s"] == 6.0 and int(lost["requests"]) > 0  # type: ignore[call-overload]
    ends = events(result, "request_end")
    moved = [e for e in ends if e["moved"]]
    assert moved and all(e["instance"] == "instance1" and e["status"] == "done" for e in moved)
    assert all(e["tokens_sha"] == e["undisturbed_sha"] for e in ends)
    (loss,) = result.data["serving"]["losses"]
    assert loss["spike_s"] > 2.0 and loss["lasted_s"] > 0  # the detection alone delays them 2 s
    assert "rank 1 of its group, SIGKILLed mid-decode; rank 0: PeerLost" in result.summary()


def test_the_run_on_tp_groups_of_npu_processes_equals_the_same_fleet_whole_in_this_process(
    killed: Report,
) -> None:
    scenario = parse_scenario(serving_text(), "kill.yaml")
    s = scenario.serve
    assert s is not None and s.stream is not None
    local = [_config(scenario, f"instance{k}", kv_blocks(scenario), s.policy()).instance() for k in range(2)]
    kills = {f"instance{r // 2}": t for r, t in instance_kills(scenario).items()}
    detection = scenario.policy.detection
    assert detection is not None
    requests = generate(s.stream.spec(), scenario.seed)
    outcomes = Fleet(list(local), requests, kills, detect_s=detection.timeout_s).run()
    ends = {e["request"]: e for e in events(killed, "request_end")}
    assert set(ends) == set(outcomes)
    for rid, o in outcomes.items():
        e = ends[rid]
        got = (
            e["status"],
            e["ttft_s"],
            e["tpot_s"],
            e["finish_s"],
            e["moved"],
            e["preemptions"],
            e["tokens"],
        )
        assert got == (o.status, o.ttft_s, o.tpot_s, o.finish_s, o.moved, o.preemptions, len(o.tokens))


def test_with_no_preemption_a_full_cache_fails_the_verdict_naming_the_kv_oom(tmp_path: Path) -> None:
    result = serving(tmp_path, "oom", faults="[]", blocks=400, preemption="none", tp=1, npus=2)
    assert (result.verdict, result.exit_code) == ("fail", 1)
    check = next(c for c in result.data["checks"] if c["name"] == "lost_requests")
    assert check["status"] == "fail" and "KV cache full: request" in check["summary"]
    assert "blocks in use" in check["summary"] and "tokens" in check["summary"]
    failed = [e for e in events(result, "request_end") if e["status"] == "failed"]
    assert failed and all(e["error"]["request"] == e["request"] for e in failed)  # type: ignore[index]


def test_the_same_serving_scenario_and_seed_give_the_same_journal(tmp_path: Path, killed: Report) -> None:
    """(Another seed's other tokens: tests/test_serving.py, in one process.)"""
    again = serving(tmp_path, "again")
    ja = deterministic_view(read_journal(killed.out_dir / "journal.jsonl"))
    jb = deterministic_view(read_journal(again.out_dir / "journal.jsonl"))
    strip = ("run", "seq", "file", "scenario", "node_ip", "nodes", "hosts")
    assert [{k: v for k, v in e.items() if k not in strip} for e in ja] == [
        {k: v for k, v in e.items() if k not in strip} for e in jb
    ]


@pytest.mark.slow
def test_training_and_serving_on_one_supernode_attribute_the_tail_and_priority_keeps_the_slo(
    tmp_path: Path,
) -> None:
    result = run(load_scenario(SCENARIOS / "colocated_train_serve.yaml"), tmp_path / "co")
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    names = [c["name"] for c in result.data["checks"]]
    assert "recovered" in names and "colocation" in names  # both halves judged
    (co,) = events(result, "colocation")
    rise = co["rise"]
    assert rise["checkpoint"]["ttft_p99_s"] > 1.0 and rise["allreduce"]["tpot_p99_s"] > 0.001  # type: ignore[index]
    variants = co["variants"]
    assert variants["both"]["slo_attainment"] < 0.9 <= variants["policy"]["slo_attainment"]  # type: ignore[index]
    assert result.data["serving"]["figures"]["run"]["ttft_p99_s"] == variants["policy"]["ttft_p99_s"]  # type: ignore[index]
    assert (result.out_dir / "serving.png").exists() and (result.out_dir / "timeline.png").exists()


def test_disaggregated_pools_on_npu_processes_send_each_cache_and_equal_the_fleet_in_this_process(
    tmp_path: Path,
) -> None:
    """One prefill and one decode instance, each a group of two processes: every request's cache
    parts cross from the prefill ranks to the decode ranks, and the outcomes are the in-process
    fleet's exactly."""
    text = serving_text(faults="[]").replace(
        "  instances: 2\n", "  instances: 2\n  disaggregation: {prefill: 1}\n"
    )
    scenario = parse_scenario(text, "pd.yaml")
    result = run(scenario, tmp_path / "pd")
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    ends = {e["request"]: e for e in events(result, "request_end")}
    sent = events(result, "kv_transfer")
    assert {e["request"] for e in sent} == {r for r, e in ends.items() if int(e["tokens"]) > 1}  # type: ignore[call-overload]
    assert all(e["from"] == "instance0" and e["to"] == "instance1" for e in sent)
    # the undisturbed run is the same pools in this process, on caches that never fill, as here
    assert all(
        (e["tokens_sha"], e["finish_s"]) == (e["undisturbed_sha"], e["undisturbed_finish_s"])
        for e in ends.values()
    )
    (split,) = events(result, "disaggregation")
    assert split["transfers"] == len(sent) and split["decode"] == ["instance1"]


@pytest.mark.slow
def test_a_prefill_instance_killed_in_a_prefill_is_said_to_die_mid_prefill(tmp_path: Path) -> None:
    text = (SCENARIOS / "serving_disaggregated.yaml").read_text()
    moved = text.replace("target: {rank: 3}, at: {time: 20s}", "target: {rank: 1}, at: {time: 19.1s}")
    moved = moved.replace("horizon: 40s", "horizon: 24s")  # the stream's first 24 s: as in 40 s, fewer after
    assert moved.count("19.1s") == moved.count("24s") == 1  # rank 1: instance0's, prefilling at 19.1 s
    result = run(parse_scenario(moved, "prefill_kill.yaml"), tmp_path / "run")
    (lost,) = [e for e in result.events() if e["event"] == "instance_lost"]
    assert lost["instance"] == "instance0" and lost["point"] == "prefill"
    assert "rank 1 of its group, SIGKILLed mid-prefill; rank 0: PeerLost" in result.summary()
    assert result.passed
