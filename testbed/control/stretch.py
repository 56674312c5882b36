"""A stretch: steps trained in one call to every rank, when nothing is due between them.

Each step costs a round of calls (the controller to each supernode, the
supernode to each NPU, and back) whatever it computes: on a 2-rank run that
is more than half of a step's CPU. Between two steps the controller fires
and heals faults, takes checkpoints and replicas, and lets the integrity
policy, an elastic rejoin, a preemption or a controller kill act. When none
of these can act (no fault in force, none fired but kills, no planned
fault's step inside the stretch, no checkpoint or replica due before its
last step, and the next arrival of a Poisson process of kills after its
last boundary), the ranks train the stretch's steps back to back in one
call, and the controller then takes each step's results in order exactly
as it takes a single step's: the journal is the same, event for event. A
planned fault's step always goes alone: a kill armed at a point of it may
fire late in the step, after the ranks it does not stop have finished it.

A stretch is as long as :data:`MAX_STEPS`, and short enough that its wall
time stays well within the guard on a call (from the wall time of the steps
before it). No link fault is in force in one, so its steps have no link-fault
hits or anchors for the cluster to count.
"""

from __future__ import annotations

import math
from typing import Any

from faults.kind import kinds
from testbed.actors.outcome import Outcome
from testbed.control.state import PhaseState
from testbed.core.errors import TestbedError

#: the most steps one call trains
MAX_STEPS = 16
#: a stretch's expected wall time stays under this share of the guard on a call
GUARD_SHARE = 0.25
#: how many steps' spans a stretch before an arrival is planned from, and the margin on the longest
SPANS, SPAN_MARGIN = 4, 1.5
INF = float("inf")

Outcomes = dict[int, Outcome]


def quiet(ctrl: Any, phase: PhaseState) -> bool:
    """Whether nothing can act between this phase's steps but a checkpoint, a replica, a planned
    fault's step or the next arrival: no fault fired in the phase but kills (a killed rank is replaced
    by the recovery it causes; what else a fault leaves behind may outlast it), none planned at a time
    rather than a step, none in force, no Poisson process but of kills, no planned preemption, no
    integrity policy, no elastic shrink, no controller kill armed, no partition, no wall-time
    safeguard (it is checked step by step)."""
    state, faults = ctrl.state, ctrl.faults
    return (
        all(kinds()[f.kind].ends_process for f in phase.faults if f.id in phase.fired)
        and not any("at_time" in f.params for f in phase.faults)
        and (phase.name != "main" or all(kinds()[p.fault.kind].ends_process for p in faults.arrivals))
        and not (ctrl.preempts.planned and phase.name == "main")
        and not faults.to_heal
        and not faults.anchored
        and not state.link_faults.faults
        and ctrl.inspector is None
        and ctrl.shrunk is None
        and state.controller_kill is None
        and not state.cut_off
        and not state.preempt_armed
        and ctrl.safeguards.wall_s is None
    )


def next_arrival(ctrl: Any, phase: PhaseState) -> float:
    """The virtual time of the main phase's next Poisson arrival (infinity: none)."""
    return min((p.next_t for p in ctrl.faults.arrivals), default=INF) if phase.name == "main" else INF


def before_arrival(ctrl: Any, phase: PhaseState, t_start: float) -> int:
    """How many steps a stretch from a boundary whose steps start by ``t_start`` may hold before the
    next arrival: an arrival fires at the first boundary at or after its time, so no boundary inside
    the stretch may reach it (the one after its last step may). A step is taken to last
    :data:`SPAN_MARGIN` times the longest of the last :data:`SPANS` steps (from the latest rank's start
    to the latest rank's end); none known yet, one step."""
    t_arrival = next_arrival(ctrl, phase)
    if t_arrival == INF:
        return MAX_STEPS
    if len(ctrl.spans) < SPANS or max(ctrl.spans) <= 0:
        return 1
    return max(1, math.floor((t_arrival - t_start) / (SPAN_MARGIN * max(ctrl.spans))))


def stretch_length(
    ctrl: Any, phase: PhaseState, step: int, step_wall_s: float | None, t_start: float = 0.0
) -> int:
    """How many steps from ``step`` to train in one call: 1 unless the phase is :func:`quiet`; then up
    to the first step a checkpoint or replica is due after, the phase's last step, :data:`MAX_STEPS`,
    the steps that fit the guard at ``step_wall_s`` of wall time each (None: not known yet, 1), and
    those that end before the next arrival (:func:`before_arrival`; ``t_start``: when the latest rank
    starts the first step)."""
    if step_wall_s is None or not quiet(ctrl, phase):
        return 1
    fits = int(GUARD_SHARE * ctrl.cluster.guard_s / max(step_wall_s, 1e-6))
    fits = min(fits, before_arrival(ctrl, phase, t_start))
    last = min([ctrl.scenario.workload.steps, step + min(MAX_STEPS, fits) - 1])
    last = min([last, *(f.step - 1 for f in phase.faults if f.step >= step)])  # its step, one alone
    checkpoint = ctrl.scenario.policy.checkpoint
    every = checkpoint.every if phase.ckpt_root is not None else 0
    replicas = checkpoint.replicas_every(ctrl.strategy.replicas_by_default) if phase.name == "main" else 0
    for s in range(step, last + 1):
        if (every and s % every == 0) or (replicas and s % replicas == 0):
            return s - step + 1
    return max(1, last - step + 1)


def split(out: Outcomes, first: int, t_arrival: float = INF) -> list[Outcomes]:
    """Each step's outcomes from one ``train_steps`` call, in order, up to the first step any rank
    failed (its outcomes last). Every rank failed there or trained it, and no boundary inside the
    stretch reached ``t_arrival``: else a rank started a step the controller must not see, an error."""
    done = {r: _done(o) for r, o in out.items()}
    failed = [len(d) for r, d in done.items() if not out[r].ok]
    count = min(failed) + 1 if failed else len(next(iter(done.values())))
    past = sorted(r for r, d in done.items() if len(d) > (count if out[r].ok else count - 1))
    if failed and past:
        raise TestbedError(
            f"ranks {past} trained past step {first + count - 1}, where a rank failed within a stretch "
            "of steps: a failure the testbed did not expect where no fault is planned; please report it "
            "with the scenario and seed",
            step=first + count - 1,
            ranks=past,
        )
    steps = [{r: _at(out[r], done[r], i) for r in sorted(out)} for i in range(count)]
    for i, step_out in enumerate(steps[:-1]):
        if min(o.value["t"] for o in step_out.values()) >= t_arrival:
            raise TestbedError(
                f"the boundary after step {first + i}, inside a stretch of steps, is past the arrival at "
                f"{t_arrival:g} s: steps took longer than those before them; please report it with the "
                "scenario and seed",
                step=first + i,
            )
    return steps


def went_on(step: int, after: tuple[int, float]) -> None:
    """Raise unless training went on to the next step, nothing held, after ``step`` inside a stretch."""
    if after != (step + 1, 0.0):
        raise TestbedError(
            f"step {step}, inside a stretch of steps, was followed by a recovery or a hold: only steps "
            "nothing acts between go in one; please report it with the scenario and seed",
            step=step,
        )


def with_span(spans: list[float], out: Outcomes) -> list[float]:
    """The last :data:`SPANS` spans with this step's: from its latest rank's start to its latest end."""
    values = [o.value for o in out.values()]
    return [*spans[1 - SPANS :], max(v["t"] for v in values) - max(v["t_start"] for v in values)]


def _done(o: Outcome) -> list[dict[str, Any]]:
    """The results of the steps a rank trained in a stretch (all of them, or those before its failure)."""
    if o.ok:
        return list(o.value["steps"])
    fields = getattr(o.error, "fields", {})
    if "done" in fields and hasattr(o.error, "done"):
        delattr(o.error, "done")  # the error is then the one a single step's call would give
    return list(fields.pop("done", None) or [])


def _at(o: Outcome, done: list[dict[str, Any]], i: int) -> Outcome:
    """The rank's outcome of the stretch's ``i``-th step: its result, or its error at its failing step."""
    if i < len(done):
        return Outcome(value=done[i])
    return Outcome(error=o.error)
