"""``expect.reference_run: false``: when a scenario may skip its reference run, and why not when not."""

from __future__ import annotations

from testbed.scenario.expect import AGAINST_REFERENCE
from testbed.scenario.model import Scenario


def reference_problems(scenario: Scenario) -> list[tuple[tuple[str | int, ...], str]]:
    """Why ``reference_run: false`` cannot be (the key's path and the message), if it cannot: a check
    declared that compares with the reference, or data that may go wrong silently (judged against it)."""
    expect = scenario.expect
    if expect.reference_run is not False:
        return []
    path: tuple[str | int, ...] = ("expect", "reference_run")
    declared = [name for name in AGAINST_REFERENCE if getattr(expect, name) is not None]
    if declared:
        why = (
            f"{declared[0]} compares the run with the uninterrupted reference run, which reference_run: "
            f"false skips; drop {declared[0]} or reference_run"
        )
        return [(path, why)]
    if scenario.corrupts_silently or scenario.policy.integrity is not None:
        what = "silent corruption faults" if scenario.corrupts_silently else "an integrity policy"
        why = (
            f"a run with {what} is judged against the uninterrupted reference run; drop reference_run: false"
        )
        return [(path, why)]
    return []
