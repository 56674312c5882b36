"""The summary's fault table: each fault matched to the failure and recovery it led to."""

from __future__ import annotations

from typing import Any

from testbed.report.fault_rows import fault_rows, render_table


def fired(fid: str, kind: str, step: int, ranks: list[int], point: str = "boundary", **record: Any) -> dict:
    rank = ranks[0] if len(ranks) == 1 else -1
    return {
        "event": "fault_injected",
        "phase": "main",
        "id": fid,
        "kind": kind,
        "rank": rank,
        "step": step,
        "point": point,
        "params": {"ranks": ranks},
        "record": record,
    }


def failure(step: int, dead: list[int], t: float, by: str = "heartbeat", after: float = 15.0) -> dict:
    return {
        "event": "failure_detected",
        "phase": "main",
        "step": step,
        "dead": dead,
        "t": t,
        "t_death": t - after,
        "detected_by": by,
    }


def recovery(step: int, resume: int, by: str = "heartbeat") -> dict:
    b = {"detect_s": 15.0, "restart_s": 30.0}
    return {
        "event": "recovery_complete",
        "phase": "main",
        "fail_step": step,
        "resume_step": resume,
        "strategy": "restart",
        "detected_by": by,
        "breakdown": b,
        "total_s": 45.0,
        "t": 100.0,
    }


def test_a_kill_claims_its_recovery_even_after_a_straggler_that_never_healed() -> None:
    journal = [
        fired("f0-straggler", "straggler", 3, [2]),
        fired("f1-node_kill", "node_kill", 6, [5], "allreduce.mid"),
        failure(6, [5], 40.0),
        recovery(6, 6),
    ]
    slow, kill = fault_rows(journal)
    assert slow["detected"] == "none" and slow["recovered"] == "no failure followed"
    assert kill["when"] == "step 6 mid-allreduce" and kill["target"] == "rank 5"
    assert kill["detected"] == "heartbeat after 15 s" and kill["recovered"] == "restart from step 5"
    assert kill["breakdown"] == "45 s = detect 15 + restart 30" and kill["lost"] == [5]


def test_kills_lost_in_one_episode_share_its_recovery_and_later_kills_keep_their_own() -> None:
    """Two kills at one boundary, then a kill during the recovery from a third: each of those
    episodes is claimed by every kill whose rank it lost, and the kill after them by its own."""
    journal = [
        fired("f0#1", "node_kill", 369, [1]),
        fired("f0#2", "node_kill", 369, [0]),
        failure(369, [0, 1], 100.0),
        recovery(369, 369),
        fired("f0#3", "node_kill", 416, [1]),
        failure(416, [1], 200.0),
        fired("f0#4", "node_kill", 411, [0]),  # the rollback to 408 meets it again: recovery interrupted
        failure(411, [0], 300.0),
        recovery(411, 409),
        fired("f0#5", "node_kill", 448, [1]),
        failure(448, [1], 400.0),
        recovery(448, 441),
    ]
    rows = fault_rows(journal)
    assert [r["recovered"] for r in rows] == [
        "restart from step 368",
        "restart from step 368",
        "restart from step 408",
        "restart from step 408",
        "restart from step 440",
    ]
    assert [r["recovery"] for r in rows] == [0, 0, 1, 1, 2]
    assert rows[2]["lost"] == rows[3]["lost"] == [0, 1]


def test_a_failure_without_deaths_goes_to_the_fault_that_can_fail_a_job_and_had_not_healed() -> None:
    journal = [
        fired("f0-link_down", "link_down", 4, []),
        {"event": "fault_healed", "phase": "main", "id": "f0-link_down", "t": 10.0},
        fired("f1-hang", "hang", 8, [1], "step.start"),
        failure(8, [], 50.0, "exec_timeout"),
        recovery(8, 6, "exec_timeout"),
    ]
    link, hang = fault_rows(journal)
    assert link["recovered"] == "healed" and hang["detected"].startswith("exec_timeout")


def test_a_skipped_arrival_and_the_reference_phase_are_shown_as_they_are() -> None:
    journal = [
        fired("f0#1", "node_kill", 9, [3], skipped="its target is already dead"),
        {**fired("f9", "node_kill", 2, [0]), "phase": "reference"},
    ]
    (row,) = fault_rows(journal)
    assert row["recovered"].startswith("skipped: its target")
    header, line = render_table([row])
    assert header.split() == ["when", "what", "target", "effect", "detected", "recovered", "breakdown"]
    assert "node_kill" in line and "rank 3" in line
