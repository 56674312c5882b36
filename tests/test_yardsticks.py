"""When the yardsticks run: the reference after a recovery unless the scenario skips it, and always
when the data may have gone wrong; the probe when the main phase never resumed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from testbed.control.yardsticks import Yardsticks
from testbed.core.journal import Journal


class _Run(Yardsticks):
    """The controller's part the yardsticks read, with the reference and the probe only counted."""

    def __init__(self, tmp: Any, reference_run: bool | None, recoveries: list[Any], sdc: bool) -> None:
        self.scenario = SimpleNamespace(expect=SimpleNamespace(reference_run=reference_run))
        self.journal = Journal(tmp / "journal.jsonl", "r")
        self.journal.emit("step_end", phase="main", step=1, **({"sdc": {"0": "flip"}} if sdc else {}))
        self.recoveries = recoveries
        self.ran: list[str] = []

    def against_uninterrupted(self) -> None:
        self.ran.append("reference")

    def _probe(self) -> None:
        self.ran.append("probe")


RESUMED = SimpleNamespace(resumed=True)


@pytest.mark.parametrize(
    ("reference_run", "recoveries", "sdc", "ran", "skipped"),
    [
        (None, [RESUMED], False, ["reference"], False),
        (False, [RESUMED], False, [], True),
        (False, [RESUMED], True, ["reference"], False),  # data may have gone wrong: run it anyway
        (False, [], True, ["reference", "probe"], False),
        (None, [], False, ["probe"], False),
        (False, [SimpleNamespace(resumed=False)], False, ["probe"], True),
    ],
)
def test_the_reference_is_skipped_only_when_a_recovery_alone_calls_for_it(
    tmp_path: Any, reference_run: bool | None, recoveries: list[Any], sdc: bool, ran: list[str], skipped: bool
) -> None:
    run = _Run(tmp_path, reference_run, recoveries, sdc)
    run.yardsticks()
    assert run.ran == ran
    said = [e for e in run.journal.events if e["event"] == "reference_skipped"]
    assert [e["reason"] for e in said] == (["expect.reference_run is false"] if skipped else [])
