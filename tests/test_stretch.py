"""Stretches: steps trained in one call when nothing is due between them, journalled as single steps."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from faults.arrivals import Arrivals
from faults.kind import PlannedFault
from testbed.actors.outcome import Outcome
from testbed.control import stretch
from testbed.control.state import PhaseState
from testbed.core.errors import ProcessDied, TestbedError
from testbed.core.journal import deterministic_view, read_journal
from testbed.fabric.linkfaults import LinkFault, LinkFaultTable
from testbed.scenario.parse import parse_scenario
from tests.test_end_to_end import KILL_MID, SMALL


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
        spans=[],
    )
    for name, value in overrides.items():
        setattr(ctrl, name, value)
    return ctrl


def test_a_stretch_ends_at_a_checkpoint_the_last_step_or_its_cap() -> None:
    ctrl = _controller(SMALL.format(seed=11, faults="[]"))
    main = PhaseState("main", [], Path("ckpt"))
    assert stretch.stretch_length(ctrl, main, 1, 0.01) == 5  # the checkpoint of step 5 is due after it
    assert stretch.stretch_length(ctrl, main, 6, 0.01) == 5
    assert stretch.stretch_length(ctrl, main, 16, 0.01) == 1  # the last step
    reference = PhaseState("reference", [], None)  # no checkpoints: up to the end
    assert stretch.stretch_length(ctrl, reference, 2, 0.01) == 15
    assert stretch.stretch_length(ctrl, reference, 1, None) == 1  # a step's wall time not known yet
    ctrl.scenario = parse_scenario(SMALL.format(seed=11, faults="[]").replace("16", "400"), "s.yaml")
    assert stretch.stretch_length(ctrl, reference, 1, 0.01) == stretch.MAX_STEPS
    assert stretch.stretch_length(ctrl, reference, 1, 10.0) == 3  # 3 steps of 10 s fit a quarter of 120 s


def test_nothing_but_single_steps_while_anything_may_act_between_them() -> None:
    text = SMALL.format(seed=11, faults="[]")
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
    planned.fired.add(kill.id)  # a kill fired: its rank is replaced, and its step still goes alone
    assert stretch.stretch_length(_controller(text), planned, 10, 0.01) == 7
    assert stretch.stretch_length(_controller(text), planned, 6, 0.01) == 3  # resumed before it
    slow = PlannedFault("f1-straggler", "straggler", 1, 3, "boundary")
    slowed = PhaseState("main", [slow], None, fired={slow.id})  # what else a fault leaves may outlast it
    assert stretch.stretch_length(_controller(text), slowed, 10, 0.01) == 1
    timed = dataclasses.replace(kill, params={"at_time": 300.0})
    assert stretch.stretch_length(_controller(text), PhaseState("main", [timed], None), 1, 0.01) == 1
    preempting = _controller(text, preempts=SimpleNamespace(planned=True))
    assert stretch.stretch_length(preempting, PhaseState("main", [], None), 1, 0.01) == 1
    slow = PlannedFault("f0-straggler", "straggler", -1, 0, "boundary", {"mtbf": 60.0})
    slowing = SimpleNamespace(
        arrivals=[Arrivals(slow, np.random.default_rng(1), 300.0)], to_heal={}, anchored={}
    )
    assert (
        stretch.stretch_length(_controller(text, faults=slowing), PhaseState("main", [], None), 1, 0.01) == 1
    )
    assert stretch.stretch_length(_controller(text, faults=slowing), reference, 1, 0.01) == 16  # main only


def _poisson(text: str, next_t: float, spans: list[float]) -> Any:
    kill = PlannedFault("f0-node_kill", "node_kill", -1, 0, "boundary", {"mtbf": 60.0})
    arrivals = [Arrivals(kill, np.random.default_rng(1), next_t)]
    return _controller(text, faults=SimpleNamespace(arrivals=arrivals, to_heal={}, anchored={}), spans=spans)


def test_a_stretch_before_an_arrival_ends_a_margin_before_it() -> None:
    text = SMALL.format(seed=11, faults="[]").replace("16", "400")
    main, reference = PhaseState("main", [], None), PhaseState("reference", [], None)
    unknown = _poisson(text, 300.0, [10.0, 10.0, 10.0])  # fewer than 4 spans seen: one step
    assert stretch.stretch_length(unknown, main, 1, 0.01, t_start=0.0) == 1
    seen = _poisson(text, 300.0, [10.0, 8.0, 10.0, 10.0])
    # the arrival at 300 s fires at the first boundary at or after it; steps of 10 s (15 s with the
    # margin) from 150 s: 10 of them end by 300 s, and none of the stretch's boundaries may reach it
    assert stretch.stretch_length(seen, main, 1, 0.01, t_start=150.0) == 10
    assert stretch.stretch_length(seen, main, 1, 0.01, t_start=290.0) == 1
    assert stretch.stretch_length(seen, main, 1, 0.01, t_start=0.0) == stretch.MAX_STEPS
    assert stretch.stretch_length(seen, reference, 1, 0.01, t_start=290.0) == stretch.MAX_STEPS  # main only


def test_a_stretch_whose_boundary_reached_the_arrival_is_an_error_not_a_journal() -> None:
    out = {r: Outcome(value={"steps": [{"t": 100.0 * s, "t_start": 0.0} for s in (1, 2, 3)]}) for r in (0, 1)}
    assert len(stretch.split(out, 1, t_arrival=201.0)) == 3  # boundaries at 100 and 200 s
    with pytest.raises(TestbedError, match="past the arrival at 200 s"):
        stretch.split(out, 1, t_arrival=200.0)


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

    def counted(out: Any, first: int, *bound: float) -> list[Any]:
        calls.append(first)
        return split(out, first, *bound)

    monkeypatch.setattr(controller, "split", counted)
    scenario = parse_scenario(SMALL.format(seed=11, faults=faults), "small.yaml")
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


def test_the_scale_benchmarks_step_time_is_the_same_whether_steps_went_alone_or_in_stretches() -> None:
    from testbed.experiments.scale import _walls

    def journal(stretch_len: int) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = [
            {"event": "run_start", "wall_s": 0.0},
            {"event": "phase_start", "wall_s": 1.0},
        ]
        wall = 1.0
        for first in range(1, 13, 4):  # 3 checkpoints of 1 s each, after steps 4, 8 and 12
            for s in range(first, first + 4):
                if (s - first) % stretch_len == 0:
                    wall += 0.5 * stretch_len  # a call: 0.5 s a step, its steps journalled at its end
                events.append({"event": "step_end", "phase": "main", "step": s, "wall_s": wall})
            wall += 1.0
            events.append({"event": "checkpoint_committed", "step": first + 3, "wall_s": wall})
        return events

    alone, stretched = _walls(journal(1)), _walls(journal(4))
    assert alone["step_s"] == stretched["step_s"] == 0.5
