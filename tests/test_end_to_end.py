"""Whole scenarios on the session's Ray: kill, detect, restart, check; deterministic by seed."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from testbed.actors.rank_signals import process_gone
from testbed.control.runner import run
from testbed.core.journal import deterministic_view, read_journal
from testbed.report.run_report import Report
from testbed.scenario.parse import load_scenario, parse_scenario
from tests.conftest import SCENARIOS

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

SMALL = """\
version: 1
name: small
seed: {seed}
cluster: {{preset: atlas-800t-a2, supernodes: 2, npus_per_supernode: 2}}
workload: {{name: mlp, steps: 16, parallel: {{dp: 4}}, hidden: 32}}
policy:
  checkpoint: {{every: 5}}
faults: {faults}
"""
KILL_MID = "[{kind: node_kill, target: {rank: 2}, at: {step: 8, during: allreduce}}]"
KILL_BOUNDARY = "[{kind: node_kill, target: {rank: 1}, at: {step: 12}}]"


def small(tmp_path: Path, name: str, faults: str = KILL_MID, seed: int = 11) -> Report:
    return run(parse_scenario(SMALL.format(seed=seed, faults=faults), f"{name}.yaml"), tmp_path / name)


def events_of(result: Report, name: str) -> list[dict[str, object]]:
    return [e for e in read_journal(result.out_dir / "journal.jsonl") if e["event"] == name]


def test_quickstart_passes_and_the_killed_process_is_gone(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIOS / "quickstart.yaml"), tmp_path / "qs")
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    (failure,) = events_of(result, "failure_detected")
    (killed,) = failure["killed"]  # type: ignore[misc]
    assert killed["rank"] == 5 and killed["point"] == "allreduce.mid" and killed["gone"] is True
    assert process_gone(killed["pid"])
    # its supernode saw the process end (its socket closed), not Ray: NPUs are not Ray actors
    assert failure["ray_error"]["5"].startswith("ProcessDied: the process of rank 5")  # type: ignore[index]
    (replaced,) = events_of(result, "npu_replaced")
    assert replaced["new_pid"] != killed["pid"]
    (rec,) = result.data["recoveries"]
    assert set(rec["breakdown"]) == {"detect_s", "restart_s", "relink_s", "load_s", "recompute_s"}
    assert rec["breakdown"]["detect_s"] == pytest.approx(15.0)  # heartbeat 5 s x 3 missed
    # the restart reads back what step 20's checkpoint wrote, byte for byte, at the same bandwidth
    (ck20,) = [e for e in events_of(result, "checkpoint_committed") if e["step"] == 20]
    assert rec["breakdown"]["load_s"] == pytest.approx(float(ck20["write_s"]), rel=1e-12)  # type: ignore[arg-type]
    from testbed.scenario.plan import resolved_plan

    # the dry run's plan is the run's plan
    assert (
        result.data["plan_sha256"]
        == resolved_plan(load_scenario(SCENARIOS / "quickstart.yaml"))["plan_sha256"]
    )
    junit = (result.out_dir / "junit.xml").read_text()
    assert junit.count("<testcase ") == len(result.data["checks"]) and "<failure" not in junit
    assert (result.out_dir / "timeline.png").stat().st_size > 10_000
    assert rec["breakdown"]["recompute_s"] > 0  # steps 21..26 were run again
    assert rec["wall_recovery_s"] > 0
    losses = [e["loss"] for e in events_of(result, "step_end") if e["phase"] == "main"]
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5]), "the loss must visibly fall"
    assert (result.out_dir / "report.json").is_file()
    assert sorted(p.name for p in (result.out_dir / "checkpoints").iterdir()) == [
        "step_00000010",
        "step_00000020",
        "step_00000030",
        "step_00000040",
    ]


def test_incomplete_checkpoint_fails_naming_what_is_missing_and_where_it_diverged(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIOS / "incomplete_checkpoint.yaml"), tmp_path / "ic")
    assert (result.verdict, result.exit_code) == ("fail", 1)
    check = next(c for c in result.data["checks"] if c["name"] == "checkpoint_complete")
    assert check["status"] == "fail"
    assert set(check["evidence"]["missing"]) == {str(r) for r in range(8)}
    assert all(v == ["optimizer", "rng"] for v in check["evidence"]["missing"].values())
    assert check["evidence"]["diverged"] == {"resumed_from": 20, "step": 21}
    assert "optimizer, rng" in check["summary"] and "step 21" in check["summary"]


def test_same_seed_gives_the_same_journal_times_and_parameters(tmp_path: Path) -> None:
    a, b = small(tmp_path, "a"), small(tmp_path, "b")
    assert a.verdict == b.verdict == "pass"
    ja = deterministic_view(read_journal(a.out_dir / "journal.jsonl"))
    jb = deterministic_view(read_journal(b.out_dir / "journal.jsonl"))
    assert ja == jb
    times = [e["t"] for e in ja if "t" in e]
    assert len(times) > 20 and times == [e["t"] for e in jb if "t" in e]
    assert a.data["final_digest"] == b.data["final_digest"]
    other = small(tmp_path, "c", seed=12)
    assert other.data["final_digest"] != a.data["final_digest"]


def test_kill_at_a_step_boundary_is_detected_and_recovered(tmp_path: Path) -> None:
    result = small(tmp_path, "boundary", faults=KILL_BOUNDARY)
    assert result.verdict == "pass", result.data["checks"]
    (failure,) = events_of(result, "failure_detected")
    assert failure["step"] == 12 and failure["dead"] == [1]
    (resume,) = [e for e in events_of(result, "resume") if e["phase"] == "main"]
    assert resume["from_step"] == 10


def test_without_faults_a_probe_resume_proves_the_checkpoint(tmp_path: Path) -> None:
    result = small(tmp_path, "nofault", faults="[]")
    assert result.verdict == "pass", result.data["checks"]
    (probe,) = [e for e in events_of(result, "resume") if e["phase"] == "probe"]
    assert probe["from_step"] == 15
    check = next(c for c in result.data["checks"] if c["name"] == "checkpoint_complete")
    assert check["evidence"]["steps_compared"] == 1 and check["evidence"]["compared_with"] == "main"


def test_without_heartbeat_the_exec_timeout_detects_the_death(tmp_path: Path) -> None:
    text = SMALL.format(seed=11, faults=KILL_MID).replace(
        "  checkpoint: {every: 5}", "  checkpoint: {every: 5}\n  detection: null\n  timeouts: {exec_s: 300}"
    )
    result = run(parse_scenario(text, "exec.yaml"), tmp_path / "exec")
    assert result.verdict == "pass", result.data["checks"]
    (failure,) = events_of(result, "failure_detected")
    assert failure["detected_by"] == "exec_timeout"
    waits = [s["wait_start"] for s in failure["errors"].values()]  # type: ignore[attr-defined]
    assert failure["t"] == pytest.approx(min(waits) + 300.0)
    (rec,) = result.data["recoveries"]
    assert 299.0 < rec["breakdown"]["detect_s"] <= 300.0


def test_a_link_setup_timeout_fails_the_job_with_exit_1(tmp_path: Path) -> None:
    import dataclasses

    from testbed.topology.presets import PRESETS, LinkSetupModel

    slow = dataclasses.replace(
        PRESETS["atlas-800t-a2"], name="slow-setup", link_setup=LinkSetupModel(200.0, 0, 0)
    )
    PRESETS["slow-setup"] = slow
    try:
        text = SMALL.format(seed=1, faults="[]").replace("atlas-800t-a2", "slow-setup")
        result = run(parse_scenario(text, "slow.yaml"), tmp_path / "slow")
    finally:
        del PRESETS["slow-setup"]
    assert (result.verdict, result.exit_code) == ("fail", 1)
    (failed,) = events_of(result, "job_failed")
    assert failed["error_type"] == "LinkSetupTimeout"


def test_a_flapping_link_is_cured_by_op_retry_without_a_restart(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIOS / "link_flap_op_retry.yaml"), tmp_path / "flap")
    assert result.verdict == "pass", result.data["checks"]
    (failure,) = events_of(result, "failure_detected")
    assert failure["detected_by"] == "exec_timeout" and failure["dead"] == []
    receiver = failure["errors"]["2"]  # type: ignore[index]
    assert {k: receiver[k] for k in ("error", "how", "true_timeout", "peer")} == {
        "error": "CollectiveTimeout",
        "how": "direct",
        "true_timeout": True,
        "peer": 1,
    }
    (rec,) = result.data["recoveries"]
    assert rec["strategy"] == "op_retry" and rec["breakdown"] == {
        "detect_s": pytest.approx(30.0),  # the exec timeout; t - wait_start in floats
        "hold_s": 5.0,
        "interval_s": 1.0,
    }
    assert not [e for e in events_of(result, "resume") if e["phase"] == "main"]
    assert [e["id"] for e in events_of(result, "fault_healed")] == ["f0-link_flap"]


def test_a_version_mismatch_fails_the_job_naming_both_sides(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIOS / "version_mismatch.yaml"), tmp_path / "vm")
    assert (result.verdict, result.exit_code) == ("fail", 1)
    (failed,) = events_of(result, "job_failed")
    assert failed["error_type"] == "LinkSetupError"
    assert (
        "EI0005" in failed["error"] and "HCCL 7.0.0" in failed["error"] and "HCCL 8.0.RC3" in failed["error"]
    )
    assert "aborted" not in failed["error"]  # the root cause, not a peer's copy of it
    checks = {c["name"]: c for c in result.data["checks"]}  # nothing to judge is unknown, not pass
    assert checks["goodput"]["status"] == "unknown" and checks["detection"]["status"] == "unknown"
    assert checks["failures"]["summary"].startswith("1 failure(s); first at the job's start")


@pytest.mark.parametrize("policy", ["none", "defragment", "pool"])
def test_memory_fragmentation_ooms_without_a_policy_and_runs_clean_with_one(
    tmp_path: Path, policy: str
) -> None:
    result = run(load_scenario(SCENARIOS / f"memory_fragmentation_{policy}.yaml"), tmp_path / policy)
    trend = result.data["memory_trend"]
    assert trend and all(0.0 <= m["fragmentation"] < 1.0 for m in trend)
    if policy == "none":
        assert (result.verdict, result.exit_code) == ("aborted", 3)  # every restart OOMs again
        failures = next(c for c in result.data["checks"] if c["name"] == "failures")
        assert failures["status"] == "fail"
        first = failures["evidence"]["failures"][0]
        assert first["step"] == 34 and first["detected_by"] == "device_oom"
        assert "cannot allocate" in first["cause"] and "free in all" in first["cause"]
        before = [m["fragmentation"] for m in trend if m["step"] < 34][:33]  # the first pass, up to the OOM
        rises = sum(b - a > 0.05 for a, b in itertools.pairwise(before))
        assert before[0] < 0.1 and max(before) > 0.6 and rises >= 5  # it climbs, step by step, to the OOM
        return
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    actions = {e["action"] for e in result.data["memory_events"]}
    assert actions == {"defragment" if policy == "defragment" else "borrow"}
    assert result.data["memory_events"][0]["step"] == 34


FRAGMENT = """\
version: 1
name: fragment
seed: 4
cluster: {preset: atlas-800t-a2, supernodes: 1, npus_per_supernode: 2, device_memory: 8MiB}
workload: {name: mlp, steps: 10, parallel: {dp: 2}, hidden: 16}
policy: {checkpoint: {every: 5}}
faults:
  - {kind: memory_fragment, target: {rank: 1}, at: {step: 4}, block: 256KiB, count: 6, spacing: 512KiB,
     release_after: 3}
"""


def test_a_memory_fragment_fault_pins_blocks_until_released(tmp_path: Path) -> None:
    result = run(parse_scenario(FRAGMENT, "fragment.yaml"), tmp_path / "frag")
    assert result.verdict == "pass", result.data["checks"]
    frag = {
        e["step"]: e["memory"]["fragmentation"] for e in events_of(result, "step_end") if e["phase"] == "main"
    }
    alloc = {
        e["step"]: e["memory"]["allocated"] for e in events_of(result, "step_end") if e["phase"] == "main"
    }
    assert alloc[4][1] - alloc[3][1] == 6 * 256 * 1024  # rank 1 carries the pinned blocks...
    assert alloc[4][0] == alloc[3][0]  # ...rank 0 does not
    assert frag[4][1] > frag[3][1]
    (healed,) = events_of(result, "fault_healed")
    assert healed["id"] == "f0-memory_fragment"
    assert alloc[7][1] == alloc[3][1]  # released at the step-7 boundary


def test_a_2x2x2_transformer_loses_a_rank_mid_tp_allreduce_and_resumes_bit_for_bit(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIOS / "parallel_2x2x2.yaml"), tmp_path / "p8")
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    (failure,) = events_of(result, "failure_detected")
    assert [k["rank"] for k in failure["killed"]] == [5]  # type: ignore[index]
    errors = failure["errors"]
    assert sorted(errors) == ["0", "1", "2", "3", "4", "6", "7"]  # type: ignore[arg-type]
    assert {e["error"] for e in errors.values()} == {"PeerLost"}  # type: ignore[union-attr]
    assert errors["4"]["how"] == "eof"  # type: ignore[index]  # its TP partner saw the death itself
    steps = [e for e in events_of(result, "step_end") if e["phase"] == "main"]
    assert all(len(e["bubble_s"]) == 8 for e in steps)  # type: ignore[arg-type]
    typical = result.data["step_time"]
    assert typical["bubble_s"] > 0 and typical["comm_wait_s"] > 0 and typical["flops"] > 0
    assert result.data["layout"] == "dp2 x tp2 x pp2 x ep1"


def test_an_unsupported_operator_fails_the_job_at_first_use_without_a_timeout(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIOS / "unsupported_op.yaml"), tmp_path / "op")
    assert (result.verdict, result.exit_code) == ("fail", 1)
    (failed,) = events_of(result, "job_failed")
    assert failed["error_type"] == "UnsupportedOperator"
    assert failed["rank"] == 6 and failed["op"] == "softmax" and failed["layer"] == "block 3 (moe gate)"
    (failure,) = events_of(result, "failure_detected")
    assert failure["step"] == 5 and failure["detected_by"] == "operator_error"
    assert {e["error"] for e in failure["errors"].values()} == {"UnsupportedOperator"}  # type: ignore[union-attr]
    assert float(failure["t"]) - float(failure["t_death"]) < 1.0  # type: ignore[arg-type]  # no exec timeout ran
    assert not events_of(result, "recovery_complete")


def test_a_16_rank_moe_layout_with_a_distributed_optimizer_checkpoints_bit_for_bit(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIOS / "parallel_2x2x2x2.yaml"), tmp_path / "p16")
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    (resume,) = events_of(result, "resume")
    assert resume["phase"] == "probe" and len(resume["components"]) == 16  # type: ignore[arg-type]
    algorithms = {a.split(":")[0] for e in events_of(result, "step_end") for a in e["algorithms"]}  # type: ignore[attr-defined]
    assert {"alltoall", "reduce_scatter", "allgather", "allreduce"} <= algorithms
    (ckpt,) = [e for e in events_of(result, "checkpoint_committed") if e["step"] == 10]
    assert ckpt["bytes"] > 0


def test_a_writer_killed_mid_checkpoint_leaves_it_uncommitted_and_the_job_restarts(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIOS / "storage_torn_write.yaml"), tmp_path / "torn")
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    (failed,) = events_of(result, "checkpoint_failed")
    assert failed["step"] == 20 and failed["written"] == [0, 1, 3]
    (failure,) = events_of(result, "failure_detected")
    (killed,) = failure["killed"]  # type: ignore[misc]
    assert killed["rank"] == 2 and killed["point"] == "shard.mid" and process_gone(killed["pid"])
    (resume,) = [e for e in events_of(result, "resume") if e["phase"] == "main"]
    assert resume["from_step"] == 10  # the torn step-20 checkpoint was never a candidate
    committed = [e["step"] for e in events_of(result, "checkpoint_committed") if e["phase"] == "main"]
    assert committed == [10, 20, 30]  # step 20 written again after the restart


def test_a_corrupt_checkpoint_is_skipped_quarantined_and_written_again(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIOS / "storage_corrupt.yaml"), tmp_path / "rot")
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    (injected,) = [e for e in events_of(result, "fault_injected") if e["kind"] == "storage_corrupt"]
    assert injected["record"]["corrupted"] is True  # type: ignore[index]
    (skipped,) = events_of(result, "checkpoint_skipped")
    assert "step_00000020: rank 1 optimizer fails its sha256" in skipped["reason"]  # type: ignore[operator]
    (resume,) = [e for e in events_of(result, "resume") if e["phase"] == "main"]
    assert resume["from_step"] == 10
    (moved,) = events_of(result, "checkpoint_quarantined")
    assert moved["step"] == 20 and str(moved["to"]).endswith("step_00000020.bad")
    assert [e["steps"] for e in events_of(result, "checkpoint_pruned")] == [[10]]  # keep: 2


def test_a_lost_supernode_takes_all_its_npus_and_the_job_restarts(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIOS / "supernode_loss.yaml"), tmp_path / "sn")
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    (failure,) = events_of(result, "failure_detected")
    assert failure["dead"] == [4, 5, 6, 7]
    assert all(k["gone"] and process_gone(k["pid"]) for k in failure["killed"])  # type: ignore[union-attr]
    assert sorted(failure["errors"]) == ["0", "1", "2", "3"]  # type: ignore[arg-type]
    assert sorted(e["rank"] for e in events_of(result, "npu_replaced")) == [4, 5, 6, 7]  # type: ignore[type-var]


def test_a_straggler_slows_its_compute_and_the_others_wait_for_it(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIOS / "straggler.yaml"), tmp_path / "slow")
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    steps = {e["step"]: e for e in events_of(result, "step_end") if e["phase"] == "main"}
    for step in (5, 11, 20, 21):
        compute, wait = steps[step]["compute_s"], steps[step]["comm_wait_s"]
        normal = compute[0]
        assert compute[1] == compute[3] == pytest.approx(normal)  # type: ignore[index]
        if 11 <= step <= 20:  # rank 2 computes 3x as long; the others wait that long in the allreduce
            assert compute[2] == pytest.approx(3 * normal)  # type: ignore[index]
            assert wait[0] == pytest.approx(2 * normal, rel=1e-3) and wait[2] < 0.01 * normal  # type: ignore[index]
        else:
            assert compute[2] == pytest.approx(normal) and max(wait) < 0.01 * normal  # type: ignore[index,arg-type]
    assert [e["id"] for e in events_of(result, "fault_healed")] == ["f0-straggler"]


def test_a_scheduler_saved_but_never_restored_is_caught_by_the_audit(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIOS / "scheduler_dropped.yaml"), tmp_path / "lr")
    assert (result.verdict, result.exit_code) == ("fail", 1)
    (check,) = [c for c in result.data["checks"] if c["name"] == "checkpoint_complete"]
    assert check["evidence"]["missing"] == {}
    assert "step 20, rank 0: the LR scheduler is at position 10, not 20" in check["evidence"]["audit"][0]
    assert check["evidence"]["diverged"] == {"resumed_from": 10, "step": 11}
    (resume,) = [e for e in events_of(result, "resume") if e["phase"] == "main"]
    assert resume["components"]["0"] == ["data_cursor", "optimizer", "params", "rng"]  # type: ignore[index]
    # how far it ended from the uninterrupted run, component by component: the scheduler 10 steps behind
    (matches,) = [c for c in result.data["checks"] if c["name"] == "matches_uninterrupted"]
    sizes = matches["evidence"]["divergence"]
    assert sizes["lr_scheduler"]["leaf"] == "position" and sizes["lr_scheduler"]["max_abs"] == 10.0
    assert sizes["rng"]["leaves"] == 0 and sizes["data_cursor"]["leaves"] == 0  # restored: equal
    assert sizes["params"]["leaves"] > 0 and 0 < sizes["params"]["max_abs"] < 1
    assert "lr_scheduler max |diff| 10 (relative 0.333" in matches["summary"]


def test_a_frozen_rank_is_found_by_the_exec_timeout_then_killed_and_replaced(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIOS / "hang.yaml"), tmp_path / "hang")
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    (failure,) = events_of(result, "failure_detected")
    assert failure["detected_by"] == "exec_timeout" and failure["dead"] == [1]
    assert float(failure["t"]) - float(failure["t_death"]) == pytest.approx(30.0)  # type: ignore[arg-type]
    assert failure["ray_error"]["1"].startswith("RankHung: rank 1 froze at allreduce.mid of step 12")  # type: ignore[index]
    timeouts = [e for e in failure["errors"].values() if e["error"] == "CollectiveTimeout"]  # type: ignore[union-attr]
    assert timeouts and all(e["true_timeout"] is True for e in timeouts)  # the peer was stuck, not slow
    (killed,) = failure["killed"]  # type: ignore[misc]
    assert killed["point"] == "hang" and killed["gone"] is True and process_gone(killed["pid"])
    (replaced,) = events_of(result, "npu_replaced")
    assert replaced["rank"] == 1


def test_slow_then_full_storage_costs_a_checkpoint_and_a_longer_recompute(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIOS / "storage_io.yaml"), tmp_path / "io")
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    writes = {
        e["step"]: e["write_s"] for e in events_of(result, "checkpoint_committed") if e["phase"] == "main"
    }
    assert writes[10] == pytest.approx(10 * writes[30])  # a tenth of the bandwidth: ten times as long
    (failed,) = events_of(result, "checkpoint_failed")
    assert failed["step"] == 20 and failed["written"] == []
    assert all("No space left on device" in str(e) for e in failed["errors"].values())  # type: ignore[union-attr]
    (resume,) = [e for e in events_of(result, "resume") if e["phase"] == "main"]
    assert resume["from_step"] == 10  # step 20's checkpoint never existed


def test_a_data_stall_shows_in_the_journal_and_warns_past_fifteen_percent(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIOS / "data_stall.yaml"), tmp_path / "data")
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    steps = {e["step"]: e for e in events_of(result, "step_end") if e["phase"] == "main"}
    assert steps[5]["data_wait_s"] == [0.0] * 4 and steps[16]["data_wait_s"] == [0.0] * 4
    for step in (6, 15):
        assert steps[step]["data_wait_s"] == [0.0, 0.0, 0.0, pytest.approx(0.05)]
        assert min(steps[step]["comm_wait_s"][:3]) == pytest.approx(0.05, rel=1e-2)  # type: ignore[index]
    (warning,) = [e for e in events_of(result, "warning")]
    assert warning["step"] == 6 and "15% rule of thumb" in str(warning["message"])
    assert result.data["warnings"] == [warning["message"]]


def test_the_ladder_cures_a_forward_pass_link_flap_by_step_retry_without_a_restart(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIOS / "link_flap_step_retry.yaml"), tmp_path / "ladder")
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    (failure,) = events_of(result, "failure_detected")
    assert {e["error"] for e in failure["errors"].values()} == {"CollectiveTimeout"}  # type: ignore[union-attr]
    assert not events_of(result, "op_retry")  # the collective was in the forward pass: not op-retryable
    (retry,) = events_of(result, "step_retry")
    assert retry["step"] == 7
    (rec,) = result.data["recoveries"]
    assert rec["strategy"] == "step_retry" and set(rec["breakdown"]) == {
        "detect_s",
        "hold_s",
        "interval_s",
        "recompute_s",
    }
    assert rec["breakdown"]["detect_s"] == pytest.approx(30.0)
    assert not [e for e in events_of(result, "resume") if e["phase"] == "main"]  # nothing loaded from storage
    assert not events_of(result, "npu_replaced")


def test_a_hot_spare_takes_the_lost_rank_and_the_recovery_is_shorter(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIOS / "hot_spare.yaml"), tmp_path / "spare")
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    (started,) = events_of(result, "cluster_started")
    spare_pids = started["spares"]["1"]  # type: ignore[index]
    (replaced,) = events_of(result, "npu_replaced")
    assert replaced["rank"] == 5 and replaced["spare"] is True and [replaced["new_pid"]] == spare_pids
    (rec,) = result.data["recoveries"]
    assert rec["strategy"] == "hot_spare" and "restart_s" not in rec["breakdown"]
    assert rec["breakdown"]["spare_s"] == 5.0 and rec["breakdown"]["detect_s"] == pytest.approx(15.0)
    assert rec["total_s"] == pytest.approx(sum(rec["breakdown"].values()))


def test_compare_runs_one_fault_plan_under_each_strategy(tmp_path: Path) -> None:
    from testbed.experiments.compare import compare

    source = tmp_path / "cmp.yaml"
    source.write_text(SMALL.format(seed=5, faults=KILL_BOUNDARY))
    scenario = parse_scenario(source.read_text(), str(source))
    restart, spare = compare(scenario, ["restart", "hot_spare"], tmp_path / "cmp")
    # each row's replay line names the strategy it ran under (as a --set change of the file)
    assert spare["replay"] == f"testbed run {source} --set policy.recovery.strategy=hot_spare --seed 5"
    assert [restart["strategy"], spare["strategy"]] == ["restart", "hot_spare"]
    assert restart["verdict"] == spare["verdict"] == "pass"
    assert restart["recoveries"] == ["restart"] and spare["recoveries"] == ["hot_spare"]
    # the same fault, the same detection, re-link, load and recompute: only the activation differs
    assert restart["recovery_s"] - spare["recovery_s"] == pytest.approx(30.0 - 5.0)
    assert (tmp_path / "cmp" / "compare.md").read_text().count("| pass |") == 2


def test_an_async_checkpoint_cut_short_by_a_failure_is_never_loaded(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIOS / "async_checkpoint.yaml"), tmp_path / "async")
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    first = {e["step"]: e for e in events_of(result, "checkpoint_committed") if e["phase"] == "main"}
    ck20 = next(e for e in events_of(result, "checkpoint_committed") if e["step"] == 20)
    assert ck20["asynchronous"] is True and float(ck20["t"]) - float(ck20["t_resume"]) == pytest.approx(
        float(ck20["write_s"])  # type: ignore[arg-type]
    )
    (failure,) = events_of(result, "failure_detected")
    assert float(ck20["t_resume"]) <= float(failure["t_death"]) < float(ck20["t"])  # type: ignore[arg-type]
    (skipped,) = events_of(result, "checkpoint_skipped")
    assert "step_00000020" in str(skipped["reason"]) and "never persisted" in str(skipped["reason"])
    (resume,) = [e for e in events_of(result, "resume") if e["phase"] == "main"]
    assert resume["from_step"] == 10 and 10 in first
    assert (result.out_dir / "checkpoints" / "step_00000020.unpersisted").is_dir()


def test_a_topology_unaware_placement_warns_and_waits_longer_than_an_aware_one(tmp_path: Path) -> None:
    text = (SCENARIOS / "placement_unaware.yaml").read_text()
    unaware = run(parse_scenario(text, "unaware.yaml"), tmp_path / "unaware")
    aware_text = text.replace("supernodes: 4, npus_per_supernode: 2", "supernodes: 2, npus_per_supernode: 4")
    aware = run(parse_scenario(aware_text, "aware.yaml"), tmp_path / "aware")
    assert unaware.verdict == aware.verdict == "pass"
    assert any("TP group [0, 1, 2, 3] spans supernodes [0, 1]" in w for w in unaware.data["warnings"])
    assert not aware.data["warnings"]
    wait = unaware.data["step_time"]["comm_wait_s"]
    assert wait > 2 * aware.data["step_time"]["comm_wait_s"]
    # no fault, yet a hotspot: the placement, named with the links it sends the TP traffic over
    hot = unaware.data["hotspot"]
    assert (hot["verdict"], hot["culprit"]) == ("placement", [[0, 1, 2, 3], [4, 5, 6, 7]]), hot
    assert "0->2" in hot["message"] and "inside one supernode" in hot["message"]
    assert aware.data["hotspot"]["verdict"] == "none"
    assert "hotspot: TP group [0, 1, 2, 3] crosses supernodes" in unaware.summary()


def test_a_skewed_router_overloads_one_rank_and_the_hotspot_names_the_imbalance(tmp_path: Path) -> None:
    text = (SCENARIOS / "moe_skewed_routing.yaml").read_text()
    skewed = run(parse_scenario(text, "skewed.yaml"), tmp_path / "skewed")
    even = run(
        parse_scenario(text.replace("router_skew: 4.0", "router_skew: 0.0"), "even.yaml"), tmp_path / "even"
    )
    assert skewed.verdict == even.verdict == "pass"
    hot = skewed.data["hotspot"]
    assert (hot["verdict"], hot["culprit"]) == ("imbalance", [0]), hot
    assert "rank 0 computes" in hot["message"] and "balance the work" in hot["message"]
    assert even.data["hotspot"]["verdict"] == "none", even.data["hotspot"]
    assert skewed.data["step_time"]["comm_wait_s"] > 2 * even.data["step_time"]["comm_wait_s"]
    assert "hotspot: work skewed onto one rank" in skewed.summary()
