"""The state machine over a job's life: a healthy base survives it; a broken policy is caught."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from testbed.testing.state_machine import TrainingMachine
from tests.conftest import SCENARIOS

FEW = settings(max_examples=3, stateful_step_count=6, deadline=None, database=None, derandomize=True)


class DrillJob(TrainingMachine):
    """The drill base, up to two faults of any kind."""

    base = SCENARIOS / "drill.yaml"
    max_faults = 2


class TightExecJob(TrainingMachine):
    """An exec timeout shorter than a checkpoint pause: the machine must find it."""

    base = SCENARIOS / "drill_tight_exec.yaml"
    max_faults = 1
    kinds = ("checkpoint_pause",)


@pytest.mark.slow
def test_the_healthy_base_keeps_every_invariant_whatever_the_rules_do(ray_session: Any) -> None:
    run_state_machine_as_test(DrillJob, settings=FEW)


@pytest.mark.slow
def test_the_machine_catches_an_exec_timeout_shorter_than_a_checkpoint_pause(ray_session: Any) -> None:
    # found, not shrunk: the drill's test shows the shrinking (a stateful shrink reruns the job many times)
    search = settings(FEW, max_examples=10, phases=[Phase.generate], report_multiple_bugs=False)
    with pytest.raises(AssertionError, match="failures: 1 failure"):
        run_state_machine_as_test(TightExecJob, settings=search)
