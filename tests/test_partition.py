"""A partition between supernodes: its entry (bad ones refused with the fix), the links each direction
cuts, and the two checks that judge it, each shown to fail on a journal that breaks it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.core.errors import ScenarioError
from testbed.report.checks import run_checks
from testbed.report.partition_checks import check_heal_progress, check_one_history, check_zombies_fenced
from testbed.scenario.expect import Expect
from testbed.scenario.parse import parse_scenario
from testbed.scenario.plan import make_plan

SCENARIO = """\
version: 1
name: cut
seed: 3
cluster: {preset: atlas-900-a3, supernodes: 3, npus_per_supernode: 2}
workload: {name: mlp, steps: 12, parallel: {dp: 6}, hidden: 32}
faults:
  - kind: partition
    target: {supernodes: [2]}
    at: {step: 6}
    heal: 200s
"""
E = Expect()


def problems(text: str) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "cut.yaml")
    return info.value.problems  # type: ignore[attr-defined,no-any-return]


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("target: {supernodes: []}", "give at least one, like 'target: {supernodes: [1]}'"),
        ("target: {supernode: 2}", "give at least one"),
        ("target: {supernodes: [0, 1, 2]}", "names every supernode"),
        ("target: {supernodes: [3]}", "supernodes must be distinct, in 0..2"),
        ("target: {supernodes: [1, 1]}", "supernodes must be distinct"),
    ],
)
def test_a_partition_that_cuts_nothing_or_everything_is_refused_with_the_fix(change: str, said: str) -> None:
    (msg,) = problems(SCENARIO.replace("target: {supernodes: [2]}", change))
    assert "faults[0].target" in msg and said in msg


def test_a_heal_of_zero_and_an_unknown_direction_are_refused() -> None:
    msgs = problems(SCENARIO.replace("heal: 200s", "heal: 0\n    direction: sideways"))
    assert any("heal must be above 0 s" in m for m in msgs)
    assert any("direction must be both, into or out_of" in m for m in msgs)


def test_testbed_validate_exits_254_on_a_partition_that_names_no_supernode(tmp_path: Path) -> None:
    bad = tmp_path / "cut.yaml"
    bad.write_text(SCENARIO.replace("supernodes: [2]", "supernodes: []"))
    cli = "import sys; from testbed.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run(
        [sys.executable, "-c", cli, "validate", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 254 and "Traceback" not in proc.stderr
    assert "a partition cuts some supernodes off from the rest" in proc.stderr


@pytest.mark.parametrize(
    ("direction", "cut"),
    [
        ("both", {(a, b) for a in range(4) for b in (4, 5)} | {(b, a) for a in range(4) for b in (4, 5)}),
        ("into", {(a, b) for a in range(4) for b in (4, 5)}),
        ("out_of", {(b, a) for a in range(4) for b in (4, 5)}),
    ],
)
def test_each_direction_cuts_the_links_across_the_cut_it_names(direction: str, cut: set[Any]) -> None:
    text = SCENARIO.replace("heal: 200s", f"heal: 200s\n    direction: {direction}")
    (fault,) = make_plan(parse_scenario(text, "cut.yaml"))
    assert {tuple(link) for link in fault.params["links"]} == cut
    assert fault.params["heal"] == 200.0


def journal(t_heal: float | None = 100.0) -> list[dict[str, Any]]:
    """A run cut during step 4 and healed at ``t_heal``: step 4 failed, and the restart from step 2's
    checkpoint ran step 3 again from t=130 (a restart of 30 s, a link setup of 5 s; the exec timeout
    is 60 s)."""
    record = {"links": [[0, 2]], "t0": 30.0, "t_end": t_heal}
    out: list[dict[str, Any]] = [
        {"event": "run_start", "timeouts": {"exec_s": 60.0}},
        {"event": "fault_injected", "kind": "partition", "id": "f0-partition", "record": record},
    ]
    for step, t_start, t in [
        (1, 9, 10),
        (2, 19, 20),
        (3, 29, 30),
        (3, 130, 131),
        (4, 140, 141),
        (5, 150, 151),
    ]:
        out.append(
            {
                "event": "step_end",
                "phase": "main",
                "step": step,
                "digest": f"d{step}",
                "t_start": t_start,
                "t": t,
            }
        )
    out.append({"event": "group_open", "setup_s": 5.0})
    out.append(
        {"event": "recovery_complete", "phase": "main", "total_s": 35.0, "breakdown": {"restart_s": 30.0}}
    )
    for i, e in enumerate(out):
        e["seq"] = i + 1
    return out


def test_one_history_passes_when_every_run_of_a_step_agrees_and_fails_on_a_second_digest() -> None:
    events = journal()
    result = check_one_history(events, E)
    assert result.status == "pass" and result.evidence["seen_more_than_once"] == 1
    forked = [*events, {"event": "step_end", "phase": "main", "step": 3, "digest": "other", "seq": 99}]
    result = check_one_history(forked, E)
    assert (
        result.status == "fail"
        and "step 3" in result.summary
        and "1 step(s) have two histories" in result.summary
    )


def test_one_history_fails_on_a_write_that_landed_from_a_cut_off_process_and_ignores_a_refused_one() -> None:
    zombie = {"event": "zombie_write", "rank": 2, "step": 4, "digest": "stale", "seq": 50}
    assert check_one_history([*journal(), {**zombie, "landed": False}], E).status == "pass"
    result = check_one_history([*journal(), {**zombie, "landed": True}], E)
    assert result.status == "fail" and "rank 2's cut-off process" in result.summary


def test_one_history_is_unknown_without_a_step() -> None:
    assert check_one_history(journal()[:2], E).status == "unknown"


def test_heal_progress_passes_within_the_bound_and_fails_when_nothing_ends_after_the_heal() -> None:
    result = check_heal_progress(journal(), E)
    assert result.status == "pass", result
    assert result.evidence["bound_s"] == 60.0 + 30.0 + 5.0 + 1.0  # exec, restart, link setup, step
    stuck = [e for e in journal() if not (e["event"] == "step_end" and e["t"] >= 100.0)]
    result = check_heal_progress(stuck, E)
    assert (
        result.status == "fail"
        and "no step of the main phase ended after f0-partition healed" in result.summary
    )


def test_heal_progress_fails_past_its_bound_and_is_unknown_for_a_partition_for_good() -> None:
    result = check_heal_progress(journal(t_heal=30.0), E)  # the first step after it ends 101 s later
    assert result.status == "fail" and "101.000 s after the heal" in result.summary, result
    assert check_heal_progress(journal(t_heal=None), E).status == "unknown"


def test_the_partition_checks_run_only_when_a_partition_fired() -> None:
    events = [e for e in journal() if e["event"] != "recovery_complete"]
    names = {r.name for r in run_checks(events, E)}
    assert {"one_history", "heal_progress"} <= names
    without = [e for e in events if e["event"] != "fault_injected"]
    assert not {"one_history", "heal_progress"} & {r.name for r in run_checks(without, E)}
    assert "zombies_fenced" not in names  # no partition of this run cut the controller off
    events[1]["params"] = {"cuts_control": True}
    assert "zombies_fenced" in {r.name for r in run_checks(events, E)}


def test_zombies_fenced_passes_when_every_late_commit_was_refused_and_fails_when_one_landed() -> None:
    refused = {
        "event": "zombie_write",
        "rank": 2,
        "step": 6,
        "epoch": 0,
        "landed": False,
        "refused": "fenced: x",
    }
    assert check_zombies_fenced([refused], E).status == "pass"
    landed = {**refused, "rank": 3, "landed": True, "path": "/ckpt/step_00000006"}
    result = check_zombies_fenced([refused, landed], E)
    assert (
        result.status == "fail"
        and "1 of 2 commit(s)" in result.summary
        and "rank 3's step 6" in result.summary
    )
    assert check_zombies_fenced(journal(), E).status == "unknown"


def test_the_storage_fence_refuses_a_commit_with_an_older_epoch_and_publishes_nothing(tmp_path: Path) -> None:
    from testbed.core.errors import CheckpointError
    from testbed.train import checkpoint as ckpt

    def commit(step: int, epoch: int | None) -> Path:
        ckpt.step_dir(tmp_path, step, tmp=True).mkdir(parents=True)
        return ckpt.commit(tmp_path, step, {"step": step, "ranks": {}}, epoch=epoch)

    assert commit(1, 0).name == "step_00000001"  # no fence yet: anything lands
    ckpt.raise_fence(tmp_path, 2)
    with pytest.raises(CheckpointError) as err:
        commit(2, 1)
    assert "fenced: it carries group epoch 1, the storage's fence is at epoch 2" in str(err.value)
    assert [s for s, _ in ckpt.committed(tmp_path)] == [1]
    assert commit(3, 2).name == "step_00000003" and commit(4, None).name == "step_00000004"


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("fencing", ["epoch", "none"])
def test_a_zombie_s_late_commit_is_refused_by_the_fence_and_without_it_forks_the_step(
    tmp_path: Path, fencing: str
) -> None:
    from testbed.control.runner import run
    from testbed.core.journal import read_journal
    from testbed.scenario.overrides import apply
    from tests.conftest import SCENARIOS

    path = SCENARIOS / "partition_with_zombie.yaml"
    scenario = apply(path.read_text(), str(path), [f"policy.checkpoint.fencing={fencing}"])
    result = run(scenario, tmp_path / fencing)
    events = read_journal(result.out_dir / "journal.jsonl")
    (failure,) = [e for e in events if e["event"] == "failure_detected"]
    assert failure["dead"] == [2, 3] and {k["point"] for k in failure["killed"]} == {"partition"}
    assert not any(k["gone"] for k in failure["killed"])  # given up, not ended: they ran on
    writes = [e for e in events if e["event"] == "zombie_write"]
    assert [w["rank"] for w in writes] == [2, 3] and all(w["step"] == 6 and w["epoch"] == 0 for w in writes)
    checks = {c["name"]: c["status"] for c in result.data["checks"]}
    if fencing == "epoch":
        assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
        assert all("fenced: it carries group epoch 0" in w["refused"] for w in writes)
        assert not (result.out_dir / "checkpoints" / "step_00000006").exists()
    else:
        assert checks["one_history"] == "fail" and checks["zombies_fenced"] == "fail"
        assert writes[0]["landed"] and "already exists" in writes[1]["refused"]
        manifest = json.loads(
            (result.out_dir / "checkpoints" / "step_00000006" / "manifest.json").read_text()
        )
        assert manifest["zombie"] == 2 and manifest["step"] == 6


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("max_restarts", [4, 2])
def test_a_partition_that_outlasts_the_restart_fails_each_relink_until_it_heals_or_restarts_run_out(
    tmp_path: Path, max_restarts: int
) -> None:
    from testbed.control.runner import run
    from testbed.core.journal import read_journal
    from tests.conftest import SCENARIOS

    text = (SCENARIOS / "partition_heals.yaml").read_text().replace("heal: 200s", "heal: 1000s")
    text = text.replace("max_restarts: 4", f"max_restarts: {max_restarts}")
    result = run(parse_scenario(text, "long-cut.yaml"), tmp_path / "run")
    events = read_journal(result.out_dir / "journal.jsonl")
    failed = [e for e in events if e["event"] == "relink_failed"]
    checks = {c["name"]: c for c in result.data["checks"]}
    assert [e["restarts"] for e in failed] == list(range(2, 2 + len(failed)))  # each one a restart
    if max_restarts == 4:  # three re-links fail while the cut holds; the fourth, after the heal, links
        assert (result.verdict, len(failed)) == ("pass", 3), checks
        assert checks["heal_progress"]["status"] == "pass", checks["heal_progress"]["summary"]
        assert all(e["t"] - 300 < 1006.2 for e in failed)  # each failed attempt began before the heal
    else:  # the restarts run out before the heal: the job fails for good, and no step follows the heal
        assert len(failed) == 1 and checks["recovered"]["status"] == "fail"
        assert "exceeds" not in checks["recovered"]["summary"] and checks["heal_progress"]["status"] == "fail"
