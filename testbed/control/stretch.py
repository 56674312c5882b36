"""A stretch: steps trained in one call to every rank, when nothing is due between them.

Each step costs a round of calls (the controller to each supernode, the
supernode to each NPU, and back) whatever it computes: on a 2-rank run that
is more than half of a step's CPU. Between two steps the controller fires
and heals faults, takes checkpoints and replicas, and lets the integrity
policy, an elastic rejoin, a preemption or a controller kill act. When none
of these can act (no fault fired in the phase yet or in force, the next
planned one at a later step, no checkpoint or replica due before the
stretch's last step), the ranks train the stretch's
steps back to back in one call, and the controller then takes each step's
results in order exactly as it takes a single step's: the journal is the
same, event for event.

A stretch is as long as :data:`MAX_STEPS`, and short enough that its wall
time stays well within the guard on a call (from the wall time of the steps
before it).
"""

from __future__ import annotations

from typing import Any

from testbed.actors.outcome import Outcome
from testbed.control.state import PhaseState
from testbed.core.errors import TestbedError

#: the most steps one call trains
MAX_STEPS = 16
#: a stretch's expected wall time stays under this share of the guard on a call
GUARD_SHARE = 0.25

Outcomes = dict[int, Outcome]


def quiet(ctrl: Any, phase: PhaseState) -> bool:
    """Whether nothing can act between this phase's steps but a checkpoint, a replica or the next
    planned fault's step: no fault fired in the phase yet, none planned at a time rather than a step,
    none in force, no Poisson process, no planned preemption, no integrity policy, no elastic shrink,
    no controller kill armed, no partition, no wall-time safeguard (it is checked step by step)."""
    state, faults = ctrl.state, ctrl.faults
    return (
        not phase.fired
        and not any("at_time" in f.params for f in phase.faults)
        and not (faults.arrivals and phase.name == "main")
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


def stretch_length(ctrl: Any, phase: PhaseState, step: int, step_wall_s: float | None) -> int:
    """How many steps from ``step`` to train in one call: 1 unless the phase is :func:`quiet`; then up
    to the first step a checkpoint or replica is due after, the phase's last step, :data:`MAX_STEPS`,
    and the steps that fit the guard at ``step_wall_s`` of wall time each (None: not known yet, 1)."""
    if step_wall_s is None or not quiet(ctrl, phase):
        return 1
    fits = int(GUARD_SHARE * ctrl.cluster.guard_s / max(step_wall_s, 1e-6))
    last = min([ctrl.scenario.workload.steps, step + min(MAX_STEPS, fits) - 1])
    last = min([last, *(f.step - 1 for f in phase.faults)])  # a fault fires before its step
    checkpoint = ctrl.scenario.policy.checkpoint
    every = checkpoint.every if phase.ckpt_root is not None else 0
    replicas = checkpoint.replicas_every(ctrl.strategy.replicas_by_default) if phase.name == "main" else 0
    for s in range(step, last + 1):
        if (every and s % every == 0) or (replicas and s % replicas == 0):
            return s - step + 1
    return max(1, last - step + 1)


def split(out: Outcomes, first: int) -> list[Outcomes]:
    """Each step's outcomes from one ``train_steps`` call, in order, up to the first step any rank
    failed (its outcomes last). Every rank failed there or trained it: a rank gone past it would have
    started a step the controller must not see, and is a harness error."""
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
    steps: list[Outcomes] = []
    for i in range(count):
        steps.append({r: _at(out[r], done[r], i) for r in sorted(out)})
    return steps


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
