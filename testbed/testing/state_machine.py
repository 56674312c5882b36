"""A Hypothesis state machine over a training job's life: users subclass it or configure it.

The rules walk the job through its steps and decide what happens on the way:
``train`` moves on some steps, ``inject`` puts a fault at the next step,
``heal`` ends the open slow-down faults, ``checkpoint_now`` moves on to the
next checkpoint step, and ``recover`` moves on past a process loss (the
recovery the policy makes then). What the rules build is a fault schedule
against the base scenario; a job takes seconds to start, so the machine runs
it once per example, at ``teardown``, after healing everything (the liveness
check), and then asserts the invariants on the run's journal and files:

- the step never goes backwards except to where a recovery resumed;
- every committed checkpoint is complete and verifies;
- no wait passes its timeout unnoticed;
- parameters after recovery equal those of an uninterrupted run at the same
  step (the scenario's ``checkpoint_complete`` and ``matches_uninterrupted``);
- the job reaches its last step.

``target`` is called with the slowest recovery's virtual seconds, so
Hypothesis steers towards the slowest recoveries. Configure with class
attributes::

    class MyJob(TrainingMachine):
        base = "my_job.yaml"
        max_faults = 2

    def test_my_job(ray_session):  # the plugin's fixture: one Ray for every example
        run_state_machine_as_test(MyJob, settings=settings(MyJob.settings, max_examples=5))

``TrainingMachine.settings`` has no deadline (an example runs a job: seconds,
not Hypothesis' default 200 ms), so settings built on it keep none whatever
profile the project loads.

(``MyJob.TestCase`` works too, but starts Ray for each example unless it is
already running.)
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, ClassVar

from hypothesis import settings, target
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from faults.kind import checkpoint_step
from faults.kind import kinds as fault_kinds
from testbed.core.journal import read_journal
from testbed.report.invariants import broken
from testbed.scenario.model import Scenario
from testbed.scenario.parse import load_scenario
from testbed.testing.schedules import SCHEDULE_KINDS, can_coexist, faults, with_faults


class TrainingMachine(RuleBasedStateMachine):
    """Rules build a fault schedule step by step; teardown runs it and checks the invariants."""

    #: the base scenario (a file); its faults are replaced by the schedule the rules build (by default
    #: the library's drill base, in a source checkout of the testbed)
    base: ClassVar[str | Path] = Path(__file__).resolve().parents[2] / "scenarios" / "drill.yaml"
    #: what an example of this machine needs: no deadline (each runs a job, for seconds), a few examples
    #: of a few rules; build on it (``settings(MyJob.settings, max_examples=20)``)
    settings: ClassVar[settings] = settings(deadline=None, max_examples=5, stateful_step_count=8)
    #: the most faults one example injects
    max_faults: ClassVar[int] = 3
    #: the fault kinds ``inject`` draws from
    kinds: ClassVar[tuple[str, ...]] = SCHEDULE_KINDS
    _loaded: ClassVar[dict[str, Scenario]] = {}

    def __init__(self) -> None:
        super().__init__()
        key = str(self.base)
        if key not in self._loaded:
            self._loaded[key] = load_scenario(self.base)
        self.scenario = self._loaded[key]
        self.step = 0  # the last step the job has been walked through
        self.schedule: list[dict[str, Any]] = []
        self.result: Any = None

    @property
    def _steps(self) -> int:
        return self.scenario.workload.steps

    @rule(n=st.integers(1, 4))
    def train(self, n: int) -> None:
        """Train ``n`` more steps (never past the last)."""
        self.step = min(self._steps, self.step + n)

    @precondition(lambda self: self.scenario.policy.checkpoint.every > 0)
    @rule()
    def checkpoint_now(self) -> None:
        """Train on to the next checkpoint step."""
        every = self.scenario.policy.checkpoint.every
        self.step = min(self._steps, (self.step // every + 1) * every)

    @precondition(lambda self: len(self.schedule) < self.max_faults and self.step < self._steps)
    @rule(data=st.data())
    def inject(self, data: st.DataObject) -> None:
        """A fault at the next step (one acting on a checkpoint: at the next checkpoint), valid there
        and able to coexist with those before it."""
        entry = data.draw(faults(self.scenario, self.kinds))
        step = self.step + 1
        if fault_kinds()[entry["kind"]].acts_on_checkpoint:  # the next checkpoint left before the last step
            step = checkpoint_step(step, self.scenario.policy.checkpoint.every)
            if step >= self._steps:
                return
        entry = {**entry, "at": {**entry["at"], "step": step}}
        if can_coexist([*self.schedule, entry]):
            self.schedule.append(entry)

    @rule()
    def heal(self) -> None:
        """End every open slow-down at the current step."""
        for f in self.schedule:
            if "for_steps" in f and f["at"]["step"] <= self.step:
                f["for_steps"] = max(1, min(f["for_steps"], self.step - f["at"]["step"] + 1))

    @precondition(lambda self: any(fault_kinds()[f["kind"]].ends_process for f in self.schedule))
    @rule()
    def recover(self) -> None:
        """Move past the last process loss: the policy's recovery happens there."""
        last = max(f["at"]["step"] for f in self.schedule if fault_kinds()[f["kind"]].ends_process)
        self.step = min(self._steps, max(self.step, last + 1))

    def teardown(self) -> None:
        """Heal everything, run the schedule once, and assert the invariants on what it left."""
        self.heal()
        with tempfile.TemporaryDirectory(prefix="testbed-machine-") as tmp:
            from testbed.actors.session import RaySession
            from testbed.control.runner import run

            with RaySession():
                result = run(
                    with_faults(self.scenario, sorted(self.schedule, key=lambda f: f["at"]["step"])),
                    Path(tmp) / "run",
                )
            events = read_journal(result.out_dir / "journal.jsonl")
            problems = broken(events, result.out_dir)
        recoveries = [e["total_s"] for e in events if e.get("event") == "recovery_complete"]
        target(max(recoveries, default=0.0), label="slowest recovery (virtual s)")
        failed = [f"{c['name']}: {c['summary']}" for c in result.data["checks"] if c["status"] == "fail"]
        assert not problems, f"invariants broken by {self.schedule}: {problems}"
        assert result.verdict == "pass", (
            f"schedule {self.schedule} failed: {failed or result.data.get('error')}"
        )
