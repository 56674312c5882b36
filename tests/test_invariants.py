"""The drill's invariants: each holds on a good journal and fails on a bad one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from testbed.report.invariants import broken, checkpoints_verify, finished, steps_forward, waits_noticed


def step(n: int, wait: float = 0.0) -> dict[str, Any]:
    return {"event": "step_end", "phase": "main", "step": n, "comm_wait_s": [0.0, wait]}


START = {"event": "run_start", "timeouts": {"connect_s": 120.0, "exec_s": 30.0}}
END = {"event": "phase_end", "phase": "main", "steps": 4}


def good() -> list[dict[str, Any]]:
    return [
        START,
        step(1),
        step(2),
        {"event": "failure_detected", "phase": "main", "step": 3},
        {"event": "recovery_complete", "phase": "main", "resume_step": 3},
        step(3),
        step(4),
        END,
    ]


def test_a_healthy_journal_breaks_nothing(tmp_path: Path) -> None:
    assert broken(good(), tmp_path) == {}


def test_steps_forward_fails_when_a_step_repeats_or_jumps_without_a_recovery(tmp_path: Path) -> None:
    back = [START, step(1), step(2), step(1), step(2), step(3), step(4), END]
    assert steps_forward(back, tmp_path) == ["step 1 followed step 2 with no recovery resuming there"]
    jump = [START, step(1), step(3), step(4), END]
    assert steps_forward(jump, tmp_path) == ["step 3 followed step 1 with no recovery resuming there"]
    assert steps_forward(good(), tmp_path) == []


def test_waits_noticed_fails_on_a_wait_past_exec_without_a_failure(tmp_path: Path) -> None:
    silent = [START, step(1), step(2, wait=31.0), step(3), step(4), END]
    (msg,) = waits_noticed(silent, tmp_path)
    assert "step 2" in msg and "31 s" in msg and "no failure was detected" in msg
    noticed = [*silent[:2], {"event": "failure_detected", "phase": "main", "step": 2}, *silent[2:]]
    assert waits_noticed(noticed, tmp_path) == []
    assert "no timeouts.exec_s" in waits_noticed([{"event": "run_start"}], tmp_path)[0]


def test_finished_fails_when_the_job_stops_short_or_never_ends(tmp_path: Path) -> None:
    assert "never finished" in finished([START, step(1)], tmp_path)[0]
    assert finished([START, step(1), step(2), END], tmp_path) == ["the main phase ended at step 2 of 4"]


def test_checkpoints_verify_fails_on_a_committed_checkpoint_changed_on_disk(tmp_path: Path) -> None:
    from testbed.train import checkpoint as ckpt

    root = tmp_path / "checkpoints"
    tmp = ckpt.step_dir(root, 4, tmp=True)
    tmp.mkdir(parents=True)
    payload = tmp / "rank0.bin"
    payload.write_bytes(b"\x01" * 64)
    import hashlib

    entries = {
        "params": {"file": "rank0.bin", "bytes": 64, "sha256": hashlib.sha256(b"\x01" * 64).hexdigest()}
    }
    path = ckpt.commit(root, 4, {"step": 4, "ranks": {"0": entries}})
    event = {"event": "checkpoint_committed", "phase": "main", "step": 4, "path": str(path)}
    assert checkpoints_verify([event], tmp_path) == []
    (path / "rank0.bin").write_bytes(b"\x02" * 64)
    (msg,) = checkpoints_verify([event], tmp_path)
    assert msg.startswith("the committed checkpoint of step 4 does not verify")
    assert json.loads((path / ckpt.MANIFEST).read_text())["step"] == 4
    corrupt = {
        "event": "fault_injected",
        "phase": "main",
        "kind": "storage_corrupt",
        "step": 5,
        "params": {"checkpoint": 4},
    }
    assert checkpoints_verify([event, corrupt], tmp_path) == []  # changed on purpose: not a finding
    loaded = {"event": "resume", "phase": "main", "source": "checkpoint", "from_step": 4}
    (msg,) = checkpoints_verify([event, corrupt, loaded], tmp_path)
    assert "resumed from the checkpoint of step 4, which a fault changed on purpose" in msg
