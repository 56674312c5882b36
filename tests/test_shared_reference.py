"""Runs that share their reference run (a sweep's points, a comparison's strategies) run it once, and
each journals what it would alone."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import pytest

from testbed.control import divergence, shared_reference
from testbed.control.runner import run
from testbed.control.shared_reference import repeated, scenario_key, shared_references
from testbed.core.journal import Journal, deterministic_view, read_journal
from testbed.scenario.model import Scenario
from testbed.scenario.overrides import with_overrides
from testbed.scenario.parse import load_scenario
from tests.conftest import SCENARIOS

QUICKSTART = SCENARIOS / "quickstart.yaml"


def _key(scenario: Scenario) -> str | None:
    return scenario_key(scenario, list(range(scenario.cluster.topology().world)))


def test_the_key_leaves_out_what_a_reference_run_never_reads_and_nothing_else() -> None:
    base = load_scenario(QUICKSTART)
    key = _key(base)
    assert key is not None
    for same in (
        ["policy.checkpoint.every=5"],
        ["policy.recovery.restart_s=60"],
        ["faults=[]"],
        ["expect.max_recovery_s=900"],
    ):
        assert _key(with_overrides(base, same)) == key, same
    for other in (["workload.steps=30"], ["policy.timeouts.exec_s=900"], ["workload.hidden=32"]):
        assert _key(with_overrides(base, other)) != key, other
    assert _key(base.with_seed(7)) != key
    assert scenario_key(base, [0, 1, 2]) != key  # an elastic job's fewer ranks
    assert repeated([base, with_overrides(base, ["policy.checkpoint.every=5"])]) == {key}
    assert repeated([base, base.with_seed(7)]) == set()


@pytest.mark.parametrize(
    ("stem", "why"),
    [
        ("learned_timeouts", "learned timeouts learn from its link setup"),
        ("sdc_mantissa_hash", "its skipped batches follow the main run's rollbacks"),
        ("preempt_spot_30s", "preemption"),
        ("colocated_train_serve", "serving"),
    ],
)
def test_a_reference_that_depends_on_more_than_the_text_is_never_shared(stem: str, why: str) -> None:
    assert _key(load_scenario(SCENARIOS / f"{stem}.yaml")) is None, why
    budget = dataclasses.replace(load_scenario(QUICKSTART).safeguards, wall_s=600.0)
    assert _key(dataclasses.replace(load_scenario(QUICKSTART), safeguards=budget)) is None


class _Cluster:
    """Answers the calls a reference makes of the ranks; records them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def call_ok(self, method: str, ranks: list[int], per_rank: Any = None) -> dict[int, Any]:
        self.calls.append((method, per_rank(0) if per_rank else None))
        answers = {"final_state": {"params": {"w": [1.0]}}}
        diff = {"max_abs": 0.0, "max_rel": 0.0, "leaves": 0, "leaf": None, "mismatched": []}
        return {r: answers.get(method, {"params": diff}) for r in ranks}


def _reference(journal: Journal, ran: list[bool], epoch: int) -> Any:
    def reference(replayed: bool) -> int:
        ran.append(replayed)
        if not replayed:
            journal.emit("group_open", epoch=epoch, t=0.0)
            journal.emit("phase_start", phase="reference", first_step=1)
            journal.emit("phase_end", phase="reference", t=9.0, digest="d")
        return epoch

    return reference


def test_a_kept_reference_is_replayed_with_the_replaying_runs_epoch(tmp_path: Path) -> None:
    journals = [Journal(tmp_path / f"{i}.jsonl", f"run{i}") for i in range(4)]
    ran: list[bool] = []
    cluster = _Cluster()
    with shared_references():
        for journal, epoch in zip(journals[:2], (2, 3)):  # the second run restarted once more
            divergence.against_reference(cluster, journal, [0, 1], _reference(journal, ran, epoch), "k")  # type: ignore[arg-type]
        assert ran == [False, True]  # the second replayed the first's
        assert ("difference_from", ({"params": {"w": [1.0]}},)) in cluster.calls
        mine = [e["event"] for e in journals[1].events]
        assert mine == ["group_open", "phase_start", "phase_end", "divergence"]
        assert journals[1].events[0]["run"] == "run1" and journals[1].events[0]["seq"] == 1
        assert journals[0].events[0]["epoch"] == 2 and journals[1].events[0]["epoch"] == 3
        divergence.against_reference(cluster, journals[2], [0, 1], _reference(journals[2], ran, 1), None)  # type: ignore[arg-type]
        assert ran[-1] is False  # no key (not shareable): its own
    with shared_references(only=["other"]):  # a suite keeps only keys that more than one run has
        divergence.against_reference(cluster, journals[3], [0, 1], _reference(journals[3], ran, 2), "k")  # type: ignore[arg-type]
        assert shared_reference.kept("k") is None


def _view(run_dir: Path) -> list[dict[str, Any]]:
    return deterministic_view(read_journal(run_dir / "journal.jsonl"))


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_shared_reference_runs_once_and_each_journal_is_the_one_its_run_gives_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = load_scenario(QUICKSTART)
    other = with_overrides(base, ["policy.checkpoint.every=5"])  # resumes from step 25, not 20
    run(other, tmp_path / "run")  # alone; into the folder the shared one uses (paths in messages agree)
    alone = _view(tmp_path / "run")
    shutil.move(tmp_path / "run", tmp_path / "alone")
    replayed: list[int] = []
    replay = shared_reference.replay

    def counted(journal: Any, kept: shared_reference.KeptReference, epoch: int) -> None:
        replayed.append(len(kept.events))
        replay(journal, kept, epoch)

    monkeypatch.setattr(shared_reference, "replay", counted)
    with shared_references():
        first = run(base, tmp_path / "first")
        shared = run(other, tmp_path / "run")
        assert replayed == [len(_reference_run(_view(tmp_path / "first")))]
        run(base.with_seed(7), tmp_path / "seed7")  # another seed: its own reference
    assert len(replayed) == 1
    assert first.verdict == shared.verdict == "pass"
    assert _view(tmp_path / "run") == alone
    steps = [e for e in _reference_run(alone) if e["event"] == "step_end"]
    assert len(steps) == 40 and _reference_run(alone) == _reference_run(_view(tmp_path / "first"))
    (divergence,) = [e for e in alone if e["event"] == "divergence"]
    assert divergence["components"]["params"]["leaves"] == 0


def _reference_run(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The reference run's events: its group's opening, then its phase from start to end."""
    names = [(e["event"], e.get("phase")) for e in events]
    start, end = names.index(("phase_start", "reference")), names.index(("phase_end", "reference"))
    assert events[start - 1]["event"] == "group_open"
    return [{k: v for k, v in e.items() if k != "seq"} for e in events[start - 1 : end + 1]]
