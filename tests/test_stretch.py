"""Stretches: steps trained in one call when nothing is due between them, journalled as single steps."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from faults.kind import PlannedFault
from testbed.actors.outcome import Outcome
from testbed.control import stretch
from testbed.control.state import PhaseState
from testbed.core.errors import ProcessDied, TestbedError
from testbed.core.journal import deterministic_view, read_journal
from testbed.fabric.linkfaults import LinkFault, LinkFaultTable
from testbed.scenario.parse import parse_scenario

SMALL = """\
version: 1
name: small
seed: 11
cluster: {{preset: atlas-800t-a2, supernodes: 2, npus_per_supernode: 2}}
workload: {{name: mlp, steps: 16, parallel: {{dp: 4}}, hidden: 32}}
policy:
  checkpoint: {{every: 5}}
faults: {faults}
"""
KILL_MID = "[{kind: node_kill, target: {rank: 2}, at: {step: 8, during: allreduce}}]"


def _result(step: int) -> dict[str, Any]:
    return {"step": step, "t": float(step)}


def _failed(done: int, first: int = 1) -> Outcome:
    err = TestbedError("peer lost", rank=0)
    err.fields["done"] = [_result(first + i) for i in range(done)]
    return Outcome(error=err)


# --- splitting one call's results into steps, pure ----------------------------------------------------
def test_a_stretch_every_rank_trained_splits_into_its_steps_in_order() -> None:
    out = {r: Outcome(value={"steps": [_result(s) for s in (4, 5, 6)]}) for r in (1, 0)}
    steps = stretch.split(out, 4)
    assert [sorted(s) for s in steps] == [[0, 1]] * 3
    assert [s[0].value["step"] for s in steps] == [4, 5, 6]


def test_a_stretch_ends_at_the_step_a_rank_failed_with_the_error_a_single_step_gives() -> None:
    dead = Outcome(error=ProcessDied("gone", rank=1))  # a dead rank's outcome carries nothing done
    out = {0: _failed(done=0), 1: dead}
    (only,) = stretch.split(out, 1)
    assert not only[0].ok and not only[1].ok and only[1].error is dead.error
    out = {0: _failed(done=2), 1: _failed(done=2)}
    steps = stretch.split(out, 1)
    assert len(steps) == 3 and all(o.ok for s in steps[:2] for o in s.values())
    assert not any(o.ok for o in steps[2].values())
    assert "done" not in steps[2][0].error.fields and not hasattr(steps[2][0].error, "done")


def test_a_rank_that_trained_past_another_ranks_failure_is_an_error_not_a_journal() -> None:
    ahead = Outcome(value={"steps": [_result(s) for s in (1, 2, 3)]})
    with pytest.raises(TestbedError, match=r"ranks \[1\] trained past step 2"):
        stretch.split({0: _failed(done=1), 1: ahead}, 1)


# --- how long a stretch is ----------------------------------------------------------------------------
def _controller(text: str, **overrides: Any) -> Any:
    scenario = parse_scenario(text, "s.yaml")
    ctrl = SimpleNamespace(
        scenario=scenario,
        state=SimpleNamespace(
            link_faults=LinkFaultTable(), controller_kill=None, cut_off={}, preempt_armed={}
        ),
        faults=SimpleNamespace(arrivals=[], to_heal={}, anchored={}),
        inspector=None,
        shrunk=None,
        safeguards=scenario.safeguards,
        cluster=SimpleNamespace(guard_s=120.0),
        strategy=SimpleNamespace(replicas_by_default=False),
        preempts=SimpleNamespace(planned=False),
    )
    for name, value in overrides.items():
        setattr(ctrl, name, value)
    return ctrl


def test_a_stretch_ends_at_a_checkpoint_the_last_step_or_its_cap() -> None:
    ctrl = _controller(SMALL.format(faults="[]"))
    main = PhaseState("main", [], Path("ckpt"))
    assert stretch.stretch_length(ctrl, main, 1, 0.01) == 5  # the checkpoint of step 5 is due after it
    assert stretch.stretch_length(ctrl, main, 6, 0.01) == 5
    assert stretch.stretch_length(ctrl, main, 16, 0.01) == 1  # the last step
    reference = PhaseState("reference", [], None)  # no checkpoints: up to the end
    assert stretch.stretch_length(ctrl, reference, 2, 0.01) == 15
    assert stretch.stretch_length(ctrl, reference, 1, None) == 1  # a step's wall time not known yet
    ctrl.scenario = parse_scenario(SMALL.format(faults="[]").replace("16", "400"), "s.yaml")
    assert stretch.stretch_length(ctrl, reference, 1, 0.01) == stretch.MAX_STEPS
    assert stretch.stretch_length(ctrl, reference, 1, 10.0) == 3  # 3 steps of 10 s fit a quarter of 120 s


def test_nothing_but_single_steps_while_anything_may_act_between_them() -> None:
    text = SMALL.format(faults="[]")
    reference = PhaseState("reference", [], None)
    link = LinkFault("f0", "drop", 0, 1, 0.0, 10.0)
    acting = {
        "a fault in force on a link": {
            "state": SimpleNamespace(
                link_faults=LinkFaultTable((link,)), controller_kill=None, cut_off={}, preempt_armed={}
            )
        },
        "a fault to heal": {"faults": SimpleNamespace(arrivals=[], to_heal={"f0": ()}, anchored={})},
        "an integrity policy": {"inspector": object()},
        "an elastic shrink": {"shrunk": object()},
        "a wall-time safeguard": {"safeguards": SimpleNamespace(wall_s=60.0)},
    }
    assert stretch.stretch_length(_controller(text), reference, 1, 0.01) == 16
    for what, overrides in acting.items():
        assert stretch.stretch_length(_controller(text, **overrides), reference, 1, 0.01) == 1, what
    kill = PlannedFault("f0-node_kill", "node_kill", 2, 9, "boundary")
    planned = PhaseState("main", [kill], None)
    assert stretch.stretch_length(_controller(text), planned, 1, 0.01) == 8  # it fires before step 9
    assert stretch.stretch_length(_controller(text), planned, 9, 0.01) == 1
    planned.fired.add(kill.id)  # fired: what it left behind is not known, so one step at a time
    assert stretch.stretch_length(_controller(text), planned, 10, 0.01) == 1
    timed = dataclasses.replace(kill, params={"at_time": 300.0})
    assert stretch.stretch_length(_controller(text), PhaseState("main", [timed], None), 1, 0.01) == 1
    preempting = _controller(text, preempts=SimpleNamespace(planned=True))
    assert stretch.stretch_length(preempting, PhaseState("main", [], None), 1, 0.01) == 1
    poisson = _controller(text, faults=SimpleNamespace(arrivals=[object()], to_heal={}, anchored={}))
    assert stretch.stretch_length(poisson, PhaseState("main", [], None), 1, 0.01) == 1
    assert stretch.stretch_length(poisson, reference, 1, 0.01) == 16  # arrivals fire in main only


# --- a run, stretched and not ---------------------------------------------------------------------------
@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("faults", [KILL_MID, "[]"], ids=["kill-then-reference", "no-fault-then-probe"])
def test_a_run_in_stretches_journals_what_it_journals_a_step_at_a_time(
    faults: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from testbed.control import controller
    from testbed.control.runner import run

    calls: list[int] = []
    split = stretch.split
    monkeypatch.setattr(controller, "split", lambda out, first: calls.append(first) or split(out, first))
    scenario = parse_scenario(SMALL.format(faults=faults), "small.yaml")
    stretched = run(scenario, tmp_path / "stretched")
    assert stretched.verdict == "pass", stretched.data["checks"]
    assert len(calls) >= 3, calls  # the fault-free stretches went in calls of several steps
    monkeypatch.setattr(stretch, "MAX_STEPS", 1)
    calls.clear()
    single = run(scenario, tmp_path / "single")
    assert calls == []
    a, b = (deterministic_view(read_journal(r.out_dir / "journal.jsonl")) for r in (stretched, single))
    assert [e["event"] for e in a] == [e["event"] for e in b]
    assert a == b and stretched.data["final_digest"] == single.data["final_digest"]
