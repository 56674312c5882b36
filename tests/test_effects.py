"""Every injected fault is shown to have taken effect, or to have had none, with the reason.

Each kind's reading of the journal is tested both ways on small journals (the
evidence present: it took effect; absent: it did not, and why), then a real
run shows a link fault no collective used, a set-up delay after the links
were up, and a restart whose re-link fails, as the faults table reports them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from faults.effects import fault_effects
from testbed.cli import main
from testbed.control.runner import run
from testbed.core.journal import read_journal
from testbed.report.fault_rows import fault_rows, render_table
from testbed.scenario.parse import parse_scenario

Event = dict[str, Any]


def fired(fid: str, kind: str, step: int, *, rank: int = -1, point: str = "boundary", **params: Any) -> Event:
    record = params.pop("record", {})
    return {
        "event": "fault_injected",
        "phase": "main",
        "id": fid,
        "kind": kind,
        "rank": rank,
        "step": step,
        "point": point,
        "params": params,
        "record": record,
    }


def step_end(
    step: int, ranks: range = range(4), links: dict[str, dict[str, list[float]]] | None = None
) -> Event:
    return {
        "event": "step_end",
        "phase": "main",
        "step": step,
        "links": links if links is not None else {str(r): {} for r in ranks},
    }


def death(rank: int, step: int, point: str) -> Event:
    return {
        "event": "failure_detected",
        "phase": "main",
        "step": step,
        "dead": [rank],
        "killed": [{"rank": rank, "pid": 1, "point": point, "gone": True, "step": step}],
        "errors": {},
    }


END = {"event": "phase_end", "phase": "main"}


def effect(*events: Event) -> Any:
    (found,) = fault_effects(list(events)).values()
    return found


def test_a_link_fault_took_effect_when_the_ranks_counted_it_and_names_the_used_links_when_not() -> None:
    used = {"4": {"0": [1024.0, 1e-3, 1e-3, 0.0, 1e-6]}, "3": {"2": [1024.0, 1e-3, 1e-3, 0.0, 1e-6]}}
    degrade = fired("f0", "link_degrade", 2, links=[[3, 4], [4, 3]])
    hit = {"event": "fault_hits", "phase": "main", "hits": {"f0": 12}}
    took = effect(degrade, hit, step_end(2, links=used), END)
    assert took.took and took.how == "12 message(s) slowed on 3->4, 4->3"
    idle = effect(degrade, step_end(2, links=used), END)
    assert not idle.took
    assert idle.how == "no collective sent on 3->4, 4->3 while it was in force; the job sends on 0->4, 2->3"
    delay = fired("f1", "link_setup_delay", 1, links=[[0, 4], [4, 0]])
    late = effect(delay, step_end(1, links=used), END)
    assert not late.took and "the job set them up before it" in late.how
    drop = effect(fired("f2", "link_drop", 2, links=[[0, 4]]), {**hit, "hits": {"f2": 1}}, END)
    assert drop.took and drop.how == "1 message(s) dropped on 0->4"
    version = effect(fired("f3", "version_mismatch", 0, links=[[3, -1]]), END)
    assert (
        not version.took and version.how == "no link of rank 3 was set up while it reported the other version"
    )


def test_a_kill_took_effect_where_its_rank_died_at_its_point_and_not_where_it_never_got_there() -> None:
    armed = fired(
        "f0", "node_kill", 6, rank=5, point="allreduce.mid", ranks=[5], record={"armed": "allreduce.mid"}
    )
    took = effect(armed, death(5, 6, "allreduce.mid"), END)
    assert took.took and took.how == "killed rank 5 mid-allreduce of step 6"
    never = effect(armed, death(5, 7, "allreduce.mid"))
    assert (
        not never.took and never.how == "rank 5 never reached mid-allreduce of step 6 (the job ended first)"
    )
    now = effect(fired("f1", "node_kill", 3, rank=2, ranks=[2], record={"rank": 2, "gone": True}), END)
    assert now.took and now.how == "killed rank 2 at the boundary of step 3"
    skipped = effect(fired("f2", "node_kill", 4, ranks=[1], record={"skipped": "its target is already dead"}))
    assert not skipped.took and skipped.how == "its target is already dead"


def test_a_hang_and_a_torn_write_took_effect_only_at_their_own_point() -> None:
    hang = fired("f0", "hang", 8, rank=1, point="step.start")
    assert effect(hang, death(1, 8, "hang"), END).took
    assert not effect(hang, death(1, 8, "boundary"), END).took
    torn = fired("f1", "storage_torn_write", 10, rank=2, point="shard.mid")
    assert effect(torn, death(2, 10, "shard.mid"), END).how == (
        "killed rank 2 half-way through its shard of checkpoint 10"
    )
    assert not effect(torn, END).took


def test_slowing_faults_took_effect_in_the_steps_their_ranks_ran_under_them() -> None:
    slow = fired("f0", "straggler", 5, rank=2, ranks=[2], factor=3.0, record={"heal_step": 7})
    took = effect(slow, *(step_end(s) for s in range(1, 10)), END)
    assert took.took and took.how == "compute x3 on rank 2 in 2 step run(s) (steps 5-6)"
    late = effect({**slow, "step": 10}, *(step_end(s) for s in range(1, 10)), END)
    assert not late.took and late.how == "no step of rank 2 ran while it was in force"
    stall = fired("f1", "data_stall", 3, ranks=[0, 1], record={"heal_step": None})
    assert (
        effect(stall, step_end(3), step_end(4), END).how
        == "input delayed for ranks 0,1 in 2 step run(s) (steps 3-4)"
    )
    out = effect(stall, step_end(3, range(2, 4)), END)  # ranks 0 and 1 were out of the job
    assert not out.took


def test_storage_faults_took_effect_only_on_a_checkpoint_in_their_window() -> None:
    full = fired("f0", "storage_full", 5, record={"heal_step": 7})
    failed = {"event": "checkpoint_failed", "phase": "main", "step": 6, "errors": {"0": "[Errno 28]"}}
    assert effect(full, failed, END).how == "checkpoint(s) 6 failed with ENOSPC"
    idle = effect(full, {**failed, "step": 8}, END)
    assert not idle.took and idle.how == "no checkpoint was due while the storage was full"
    slow = fired("f1", "io_saturation", 8, factor=0.1, record={"heal_step": 13})
    commit = {"event": "checkpoint_committed", "phase": "main", "step": 10, "paused": {}}
    assert effect(slow, commit, END).how == "checkpoint(s) 10 written at 0.1 of the bandwidth"
    assert not effect(slow, {**commit, "step": 15}, END).took
    pause = fired("f2", "checkpoint_pause", 10, rank=0, point="checkpoint", pause_s=60.0)
    assert effect(pause, {**commit, "paused": {"0": 60.0}}, END).how == (
        "rank 0's write of checkpoint 10 took 60 s longer"
    )
    assert not effect(pause, {**commit, "paused": {}}, END).took
    corrupt = fired("f3", "storage_corrupt", 20, rank=1, checkpoint=20, component="optimizer")
    flipped = effect({**corrupt, "record": {"corrupted": True, "bytes": 8}}, END)
    assert flipped.how == "flipped 8 bytes of rank 1's optimizer file of checkpoint 20"
    missing = effect({**corrupt, "record": {"corrupted": False, "why": "no such committed file"}}, END)
    assert not missing.took and missing.how.endswith("checkpoint 20: no such committed file")


def test_memory_and_operator_faults_read_their_own_evidence() -> None:
    pin = fired(
        "f0", "memory_fragment", 3, ranks=[0, 1], record={"after": {"0": {"pinned": 8}, "1": {"pinned": 0}}}
    )
    assert effect(pin, END).how == "pinned 8 block(s) on rank 0"
    none = fired("f1", "memory_fragment", 3, ranks=[0], record={"after": {"0": {"pinned": 0}}})
    assert not effect(none, END).took
    op = fired("f2", "unsupported_op", 5, rank=6, op="softmax")
    failure = {
        "event": "failure_detected",
        "phase": "main",
        "step": 5,
        "errors": {"6": {"error": "UnsupportedOperator", "how": "direct"}},
    }
    assert effect(op, failure).how == "rank 6 failed at its first use of softmax"
    assert effect(op, END).how == "rank 6 never called softmax after it was taken away"


def test_the_table_shows_no_effect_and_a_failed_recovery_as_they_were() -> None:
    events = [
        fired("f0-link_degrade", "link_degrade", 2, links=[[3, 4], [4, 3]]),
        fired(
            "f1-node_kill", "node_kill", 6, rank=5, point="allreduce.mid", ranks=[5], record={"armed": "x"}
        ),
        {**death(5, 6, "allreduce.mid"), "t": 45.0, "t_death": 30.0, "detected_by": "heartbeat"},
        {
            "event": "recovery_failed",
            "phase": "main",
            "fail_step": 6,
            "strategy": "restart",
            "stage": "relink",
            "error_type": "LinkSetupTimeout",
            "error": "rank 0: link setup 0->4 needs 302.9 s, past the connect timeout 120 s",
        },
        {"event": "job_failed", "error_type": "LinkSetupTimeout", "error": "rank 0: link setup"},
    ]
    degrade, kill = fault_rows(events)
    assert (
        degrade["effect"].startswith("NONE: no collective sent on 3->4") and degrade["took_effect"] is False
    )
    assert kill["detected"] == "heartbeat after 15 s"
    assert kill["recovered"] == (
        "restart failed at relink: LinkSetupTimeout: rank 0: link setup 0->4 needs 302.9 s, past the "
        "connect timeout 120 s"
    )
    lines = render_table([degrade, kill])
    assert any(line.startswith("  [1] restart failed at relink: LinkSetupTimeout") for line in lines)
    assert lines[2].endswith("restart failed at relink: LinkSetupTimeout: rank 0: l... [1]")
    beyond = fault_rows([*events[:3], {**events[3], "stage": "none", "error_type": "UnsupportedOperator"}])[1]
    assert beyond["recovered"].startswith("not attempted: no restart cures UnsupportedOperator")


LINKS = """\
version: 1
name: link-effects
seed: 3
cluster: {preset: atlas-900-a3, supernodes: 2, npus_per_supernode: 4}
workload: {name: mlp, steps: 8, parallel: {dp: 8}, hidden: 32}
policy: {checkpoint: {every: 4}}
faults:
  - {kind: link_degrade, target: {link: [3, 4]}, at: {step: 2}, bandwidth_factor: 0.01}
  - {kind: link_degrade, target: {link: [0, 4]}, at: {step: 2}, bandwidth_factor: 0.01}
  - {kind: link_setup_delay, target: {link: [0, 4]}, at: {step: 1}, delay: 10s}
"""

RELINK = """\
version: 1
name: relink-fails
seed: 3
cluster: {preset: atlas-900-a3, supernodes: 2, npus_per_supernode: 4}
workload: {name: mlp, steps: 8, parallel: {dp: 8}, hidden: 32}
policy: {checkpoint: {every: 4}}
faults:
  - {kind: link_setup_delay, target: {link: [0, 4]}, at: {step: 5}, delay: 300s}
  - {kind: node_kill, target: {rank: 5}, at: {step: 6, during: allreduce}}
"""


def test_validate_warns_of_a_link_fault_on_a_link_the_job_never_uses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "links.yaml"
    path.write_text(LINKS)
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "warning: faults[0] link_degrade on link 3<->4: the job never sends on it" in out
    assert "ranks 3 and 4 send on 0->4" in out and "faults[1]" not in out


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_run_reports_each_link_fault_that_did_nothing_and_a_restart_that_failed_at_relink(
    tmp_path: Path,
) -> None:
    links = run(parse_scenario(LINKS, "links.yaml"), tmp_path / "links")
    rows = {r["id"]: r for r in links.data["fault_table"]}
    assert rows["f0-link_degrade"]["took_effect"] is False
    assert (
        "no collective sent on 3->4, 4->3 while it was in force; the job sends on 0->4"
        in rows["f0-link_degrade"]["effect"]
    )
    assert (
        rows["f1-link_degrade"]["took_effect"] is True
        and "message(s) slowed on 0->4" in rows["f1-link_degrade"]["effect"]
    )
    assert rows["f2-link_setup_delay"]["took_effect"] is False
    assert "the job set them up before it" in rows["f2-link_setup_delay"]["effect"]
    events = read_journal(tmp_path / "links" / "journal.jsonl")
    (journalled,) = [e for e in events if e["event"] == "fault_effects"]
    assert journalled["effects"]["f1-link_degrade"]["took"] is True
    assert any("link 3<->4: the job never sends on it" in w for w in links.data["warnings"])

    relink = run(parse_scenario(RELINK, "relink.yaml"), tmp_path / "relink")
    assert relink.exit_code == 1
    delay, kill = relink.data["fault_table"]
    assert delay["took_effect"] is True and "link set-up(s) delayed on 0->4" in delay["effect"]
    assert kill["effect"] == "killed rank 5 mid-allreduce of step 6" and kill["detected"].startswith(
        "heartbeat"
    )
    assert kill["recovered"].startswith("restart failed at relink: LinkSetupTimeout: rank 0: link setup 0->4")


def test_a_death_no_fault_caused_ends_the_run_with_the_testbeds_own_line() -> None:
    from types import SimpleNamespace

    from testbed.actors.outcome import Outcome
    from testbed.core.errors import ProcessDied, TestbedError
    from testbed.recovery.restart import record_failure

    cluster = SimpleNamespace(deaths=lambda expected=None: [])  # no supervisor killed anyone
    ctrl = SimpleNamespace(cluster=cluster, detach_cut_off=lambda step, out: [])  # no partition
    out = {0: Outcome(value={}), 2: Outcome(error=ProcessDied("the process of rank 2 (pid 7) is gone"))}
    with pytest.raises(TestbedError) as err:
        record_failure(ctrl, SimpleNamespace(name="main"), 7, out)  # type: ignore[arg-type]
    text = str(err.value)
    assert text.startswith("the process of rank(s) [2] died at step 7, and no fault of the plan killed it")
    assert "seen as ProcessDied: the process of rank 2 (pid 7) is gone" in text
