"""What a recovery was: its record and breakdown, the procedures it can be, an elastic shrink in force.

Each completed recovery is journalled as ``recovery_complete`` with the
procedure that ran (``strategy`` in the journal: a policy such as ``ladder``
runs ``op_retry``, ``step_retry`` or ``restart``). :data:`PROCEDURES` is the
one place that knows what each procedure means: whether it resumed from a
persistent checkpoint, whether it went back to saved state and recomputes,
and how a report says where training went on from.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from testbed.core.errors import (
    CheckpointError,
    LinkSetupError,
    LinkSetupTimeout,
    RecoveryFailed,
    TestbedError,
)
from testbed.core.journal import Journal


@dataclass(frozen=True)
class Procedure:
    """What a completed recovery did."""

    name: str
    #: training resumed from a persistent checkpoint (the completeness check compares it)
    from_storage: bool
    #: training went back to saved state (a checkpoint or a replica) and recomputes the lost steps
    goes_back: bool
    #: where training went on from, in words (``{resume}``: the step it resumed after)
    phrase: str
    #: it ran the failed step again from its start (its ``recompute_s`` is that step: training)
    reruns_step: bool = False


#: The procedures a recovery can be, by the name the journal gives them.
PROCEDURES = {
    p.name: p
    for p in (
        Procedure("restart", True, True, "from step {resume}"),
        Procedure("hot_spare", True, True, "from step {resume}"),
        Procedure("replica", False, True, "from the in-memory replica of step {resume}"),
        Procedure("elastic", False, False, "with the data-parallel replica dropped"),
        Procedure("step_retry", False, False, "of the step", reruns_step=True),
        Procedure("op_retry", False, False, "of the collective"),
        Procedure("replay", False, False, "of the step in place"),
        Procedure("rollback", True, True, "to the checkpoint of step {resume}"),
        Procedure("exclusion", True, True, "of the NPU, and rollback to the checkpoint of step {resume}"),
    )
}


def procedure(name: str) -> Procedure:
    """The procedure journalled as ``name`` (an unknown one: in place, like a retry)."""
    return PROCEDURES.get(name, Procedure(name, False, False, "in place"))


def how(name: str, resume_step: int) -> str:
    """A completed recovery in a few words: its procedure and where training went on from."""
    return f"{name} {procedure(name).phrase.format(resume=resume_step - 1)}"


@dataclass
class Recovery:
    """One recovery: where it started, the breakdown so far, and where training resumed."""

    phase: str
    fail_step: int
    t_death: float
    t_detect: float
    detected_by: str
    resume_step: int
    t_resume: float
    breakdown: dict[str, float] = field(default_factory=dict)
    wall_start: float = 0.0
    #: the procedure that ran (:data:`PROCEDURES`)
    strategy: str = "restart"

    @property
    def resumed(self) -> bool:
        """True when training resumed from a persistent checkpoint (restart, hot spare)."""
        return procedure(self.strategy).from_storage

    @property
    def recomputes(self) -> bool:
        """True when training went back to a saved state (a checkpoint or a replica) and recomputes."""
        return procedure(self.strategy).goes_back

    def complete(self, journal: Journal, phase: str, t_done: float) -> None:
        """Close the recovery once the lost steps are recomputed; journal the breakdown."""
        if self.recomputes:
            self.breakdown["recompute_s"] = t_done - self.t_resume
        total = sum(self.breakdown.values())
        journal.emit(
            "recovery_complete",
            phase=phase,
            fail_step=self.fail_step,
            resume_step=self.resume_step,
            strategy=self.strategy,
            detected_by=self.detected_by,
            breakdown=dict(self.breakdown),
            total_s=total,
            t_death=self.t_death,
            t_resume=self.t_resume,
            t=t_done,
            wall_recovery_s=round(time.monotonic() - self.wall_start, 3),
        )


@dataclass(frozen=True)
class Shrunk:
    """An elastic job while replicas are out: which DP indices train, and when the replacements are
    ready."""

    dp_active: tuple[int, ...]
    t_ready: float
    fail_step: int


def failed_stage(exc: BaseException) -> str:
    """The stage of a recovery an error stopped: none (no restart cures the failure), re-link (link
    setup), load (a checkpoint), the restart budget, or the restart itself."""
    if isinstance(exc, TestbedError) and exc.fields.get("beyond_recovery"):
        return "none"
    if isinstance(exc, (LinkSetupTimeout, LinkSetupError)):
        return "relink"
    if isinstance(exc, CheckpointError):
        return "load"
    if isinstance(exc, RecoveryFailed):
        return "budget"
    return "restart"
