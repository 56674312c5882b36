"""What the job does after each step under ``policy.integrity``: check, replay a suspect step, roll
back; and the safeguards that leave a NaN loss to the validators."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from testbed.actors.outcome import Outcome
from testbed.integrity.inspector import Clocks, Inspector
from testbed.integrity.replay import replay_step
from testbed.integrity.rollback import roll_back
from testbed.recovery.context import Phase, RecoveryContext
from testbed.recovery.record import Recovery
from testbed.scenario.model import Safeguards, Scenario

Outcomes = dict[int, Outcome]


def respond(
    ctx: RecoveryContext,
    inspector: Inspector,
    clocks: Clocks,
    phase: Phase,
    step: int,
    out: Outcomes,
    keep: Callable[[Outcomes], None],
) -> Recovery | None:
    """Check ``step``; a step the validators alone suspect is replayed (its kept result handed to
    ``keep``); a detection the replay did not settle rolls back as the policy says. Returns the
    rollback (None: training goes on from the next step)."""
    found = inspector.after_step(clocks, phase.name, step, out)
    if found.alarm is None:
        return None
    exclude = found.exclude
    if found.replay:
        t = max(clocks.clock_of[r] for r in out)
        replayed = replay_step(ctx, inspector, phase, step, out, found.alarm, t)
        if replayed is not None and not replayed.exclude:
            keep(replayed.out)
            return None
        exclude = replayed.exclude if replayed is not None else ()
    if inspector.policy.on_detect != "rollback":
        return None
    t = max(clocks.clock_of[r] for r in ctx.active_ranks())
    return roll_back(ctx, inspector, phase, step, found.alarm, exclude, t)


def safeguards_under(scenario: Scenario) -> Safeguards:
    """The scenario's safeguards; a NaN loss is left to the validators when they run and roll back."""
    guards, integrity = scenario.safeguards, scenario.policy.integrity
    rolls_back = (
        integrity is not None and integrity.validators is not None and integrity.on_detect == "rollback"
    )
    return dataclasses.replace(guards, nan_loss=False) if rolls_back else guards
