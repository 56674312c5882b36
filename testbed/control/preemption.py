"""What a job does with a preemption's notice (``policy.preemption.on_notice``), and how it leaves.

A ``preempt`` fault has its ranks get a real SIGTERM at a point of a step
(:mod:`testbed.train.rank_preemption`); each noticed rank is SIGKILLed when
its window runs out, at the first point of its work at or past the deadline.
Between the two the job does as its policy says:

- ``none``: nothing; the SIGKILL is a failure like any other, found by the
  detectors, and the job restarts from its periodic checkpoint;
- ``save``: after every step the ranks all-reduce [got SIGTERM, step] (as
  Megatron does with its exit flag). When one did, every rank stops at that
  step (the step in flight was drained), and an emergency checkpoint of it is
  written; it commits only if its commit lands by the deadline, otherwise its
  temporary directory is left unpublished;
- ``abort``: the noticed rank leaves the step in flight, every rank with it;
  all go back to the state the step started from, link again, agree, and save
  the last finished step.

Then the noticed ranks leave for good (their node is reclaimed: SIGKILL), a
``failure_detected`` names ``preemption`` as its detector, and the job
restarts from the newest checkpoint committed by then. With
``no_progress_limit``, that many preemptions in a row that leave the newest
committed step where it was end the run (NVRx's no-progress guard).
"""

from __future__ import annotations

import time
from typing import Any

from faults.preemption import Preempt
from testbed.actors.outcome import Outcome, is_death, values_or_raise
from testbed.control.commit import write_checkpoint
from testbed.control.state import PhaseState, RunState
from testbed.core.errors import RecoveryFailed, TestbedError
from testbed.recovery.context import RecoveryContext
from testbed.recovery.record import Recovery
from testbed.recovery.restart import from_storage
from testbed.scenario.model import Scenario
from testbed.scenario.plan import make_plan
from testbed.train import checkpoint as ckpt

Outcomes = dict[int, Outcome]


def preempted(out: Outcomes) -> bool:
    """Whether a step failed because a rank left it on its preemption notice (``on_notice: abort``)."""
    return any(o.error is not None and getattr(o.error, "fields", {}).get("preempted") for o in out.values())


class Preemptions:
    """The notices of one run, and the job's answer to them."""

    def __init__(self, ctx: RecoveryContext, state: RunState, planned: bool) -> None:
        self.ctx = ctx
        self.state = state
        #: the plan holds a ``preempt`` fault (else nothing here ever acts)
        self.planned = planned
        #: rank -> its notice as journalled, until it leaves the job
        self.pending: dict[int, dict[str, Any]] = {}
        self._seen_events = 0
        self._stalled = 0  # preemptions in a row that left the newest committed step where it was

    @property
    def policy(self) -> Any:
        """``policy.preemption`` as in force (``on_notice: none`` without the section)."""
        return self.state.preemption

    def take_notices(self, phase: str) -> None:
        """Journal the SIGTERMs sent since last asked (``preempt_notice``); forget the notices of ranks a
        failure has since taken out of the job."""
        if not self.planned:
            return
        events = self.ctx.journal.events
        for e in events[self._seen_events :]:
            if e["event"] == "failure_detected":
                for r in e.get("dead", []):
                    self.pending.pop(int(r), None)
        self._seen_events = len(events)
        for record in self.ctx.cluster.notices():
            rank = int(record["rank"])
            fault, window = self.state.preempt_armed.get(rank, ("", self.policy.grace_s))
            notice = {
                "rank": rank,
                "pid": record["pid"],
                "t": float(record["t"]),
                "step": record["step"],
                "point": record["point"],
                "fault": fault,
                "window_s": window,
                "deadline": float(record["t"]) + window,
                "on_notice": self.policy.on_notice,
            }
            earlier = self.pending.get(rank)
            if earlier is not None:  # a second SIGTERM: the first's SIGKILL still stands, if sooner
                notice["deadline"] = min(notice["deadline"], earlier["deadline"])
                notice["again"] = True
            self.pending[rank] = notice
            self.ctx.journal.emit("preempt_notice", phase=phase, **notice)
            self._seen_events = len(events)

    def deadline(self) -> float | None:
        """The earliest SIGKILL due to a noticed rank still in the job (None: no notice pending)."""
        self.take_notices("main")
        return min((n["deadline"] for n in self.pending.values()), default=None)

    def after_call(self, phase: PhaseState, step: int, out: Outcomes) -> Recovery | None:
        """After a step's call: journal its notices; a step a notice aborted ends in the emergency
        save of the step before and the job's exit (``on_notice: abort``)."""
        if not self.planned or phase.name != "main":
            return None
        self.take_notices(phase.name)
        if not preempted(out) or any(is_death(o.error) for o in out.values()):
            return None
        ranks = sorted(out)
        back = self._while_noticed("back_to_step_start", step, ranks=ranks)
        if back is None:  # the window ran out before the ranks were back: leave, nothing saved
            return self._leave(phase, step, self._newest_committed(phase), self._deadline_or())
        when = [float(getattr(o.error, "fields", {}).get("t", 0.0)) for o in out.values()]
        t_abort = max([*back.values(), *when])
        try:
            self.ctx.open_group(t_abort, cold=False)  # the aborted group is gone: link again
        except TestbedError:
            if not self.pending:
                raise
            # a noticed rank's window ran out while the group was set up again: leave, nothing saved
            return self._leave(phase, step, self._newest_committed(phase), self._deadline_or())
        return self._stop(phase, step - 1, step, t_abort, wall_start=time.monotonic())

    def after_step(self, phase: PhaseState, step: int) -> Recovery | None:
        """After a finished step under ``on_notice: save``: the agreement; on a notice, the emergency
        checkpoint of this step and the job's exit."""
        if not self.planned or phase.name != "main" or self.policy.on_notice != "save":
            return None
        self.take_notices(phase.name)
        t_drained = max(self.state.clock_of.values())
        return self._stop(phase, step, step + 1, t_drained, wall_start=time.monotonic(), only_if_agreed=True)

    def _stop(
        self,
        phase: PhaseState,
        step: int,
        fail_step: int,
        t_drained: float,
        wall_start: float,
        only_if_agreed: bool = False,
    ) -> Recovery | None:
        """Agree on ``step`` (a real allreduce on every rank), save it by the deadline, leave."""
        ranks = self.ctx.active_ranks()
        agreed = self._while_noticed("agree_to_stop", step, ranks=ranks)
        if agreed is None:  # the window ran out before the ranks agreed: leave, nothing saved
            return self._leave(phase, fail_step, self._newest_committed(phase), self._deadline_or())
        for r, a in agreed.items():
            self.state.clock_of[r] = max(self.state.clock_of.get(r, 0.0), float(a["t"]))
        if only_if_agreed and not any(a["stop"] for a in agreed.values()):
            return None
        deadline = self.deadline()
        t_agreed = max(float(a["t"]) for a in agreed.values())
        self.ctx.journal.emit(
            "preempt_agreed",
            phase=phase.name,
            step=step,
            ranks={str(r): int(a["step"]) for r, a in sorted(agreed.items())},
            noticed=sorted(r for r, a in agreed.items() if a["noticed"]),
            t_notice=min((n["t"] for n in self.pending.values()), default=t_drained),
            t_drained=t_drained,
            t=t_agreed,
            deadline=deadline,
        )
        before = self._newest_committed(phase)
        if step >= 1 and phase.ckpt_root is not None:
            written = write_checkpoint(
                self.ctx.scenario,
                self.state,
                self.ctx.journal,
                phase,
                step,
                None,
                lambda hold: None,
                deadline=lambda: deadline,
            )
            del written  # committed, abandoned past the deadline, or a writer SIGKILLed mid-write
        return self._leave(phase, fail_step, before, deadline if deadline is not None else t_agreed)

    def _while_noticed(self, method: str, *args: Any, ranks: list[int]) -> dict[int, Any] | None:
        """``method`` on ``ranks``, as ``call_ok``; None when a noticed rank's window ran out during it
        (its supervisor SIGKILLed it at its deadline, and the others lost it)."""
        out = self.ctx.cluster.call(method, *args, ranks=ranks)
        if any(r in out and is_death(out[r].error) for r in self.pending):
            return None
        return values_or_raise(out)

    def _deadline_or(self) -> float:
        """The earliest pending SIGKILL (the step's start, if none is pending any more)."""
        deadline = self.deadline()
        return deadline if deadline is not None else self.ctx.now()

    def _newest_committed(self, phase: PhaseState) -> int:
        found, _ = ckpt.newest(phase.ckpt_root) if phase.ckpt_root is not None else (None, [])
        return found.step if found is not None else 0

    def _commit_time(self, phase: str, after: float) -> float | None:
        """When the emergency checkpoint committed (None: it did not)."""
        for e in reversed(self.ctx.journal.events):
            if e["event"] == "preempt_agreed":
                break
            if e["event"] == "checkpoint_committed" and e.get("phase") == phase:
                return max(float(e["t"]), after)
            if e["event"] == "checkpoint_exists" and e.get("phase") == phase:
                return after
        return None

    def _leave(self, phase: PhaseState, fail_step: int, before: int, deadline: float) -> Recovery:
        """The noticed ranks leave for good (SIGKILL: the node is reclaimed); the job restarts from the
        newest checkpoint committed by then."""
        wall_start = time.monotonic()
        t_agreed = max(self.state.clock_of.values())
        committed = self._commit_time(phase.name, t_agreed)
        t_exit = min(committed, deadline) if committed is not None else deadline
        dead = sorted(self.pending)
        point = "preempted" if committed is not None else "grace_end"
        earlier = {d["rank"]: d for d in self.ctx.cluster.deaths() if d["rank"] in dead}  # at grace_end
        for r in dead:
            if r not in earlier:
                self.ctx.cluster.kill(r, t_exit, fail_step, point)
        deaths = list(earlier.values())
        for d in self.ctx.cluster.deaths(expected=[r for r in dead if r not in earlier]):
            if d["rank"] in dead and d["rank"] not in earlier:
                earlier[d["rank"]] = d
                deaths.append(d)
        self.ctx.journal.emit(
            "failure_detected",
            phase=phase.name,
            step=fail_step,
            dead=dead,
            t_death=t_exit,
            t=t_exit,
            detected_by="preemption",
            killed=[{k: d[k] for k in ("rank", "pid", "point", "gone", "step") if k in d} for d in deaths],
            ray_error={},
            errors={},
        )
        self.pending.clear()
        self._seen_events = len(self.ctx.journal.events)
        self._count(phase, fail_step, before)
        return from_storage(self.ctx, phase, fail_step, dead, (t_exit, t_exit, "preemption"), wall_start)

    def _count(self, phase: PhaseState, fail_step: int, before: int) -> None:
        """Count the restart; end the run when preemptions keep the committed step where it was."""
        phase.restarts += 1
        policy = self.ctx.scenario.policy.recovery
        if phase.restarts > policy.max_restarts:
            raise RecoveryFailed(
                f"restart {phase.restarts} at step {fail_step} (a preemption) exceeds "
                f"policy.recovery.max_restarts = {policy.max_restarts}; raise it or make the run less faulty",
                step=fail_step,
            )
        after = self._newest_committed(phase)
        self._stalled = self._stalled + 1 if after <= before else 0
        limit = self.policy.no_progress_limit
        if limit is not None and self._stalled >= limit:
            raise RecoveryFailed(
                f"{self._stalled} preemption(s) in a row left the newest committed checkpoint at step "
                f"{after} (policy.preemption.no_progress_limit = {limit}): the job makes no progress; give "
                "the emergency save more grace or a faster storage, or checkpoint more often",
                step=fail_step,
                no_progress=self._stalled,
            )


def preemptions_for(ctx: RecoveryContext, state: RunState, scenario: Scenario) -> Preemptions:
    """The run's preemptions: its policy put in force, watched only when the plan holds a notice."""
    if scenario.policy.preemption is not None:
        state.preemption = scenario.policy.preemption
    planned = any(f.kind == Preempt.name for f in make_plan(scenario))
    return Preemptions(ctx, state, planned)
