"""Harness checks: pure functions of the journal (and the scenario's ``expect``), found by name.

Each check returns a :class:`CheckResult` with a status (``pass``, ``fail``
or ``unknown``), what it observed, and the evidence a reviewer needs. The
built-in checks live in :mod:`testbed.report.recovery_checks`,
:mod:`testbed.report.resume_checks`, :mod:`testbed.report.serving_checks` and
:mod:`testbed.report.integrity_checks`; any other is registered with
:func:`register_check` or declared as an entry point of ``testbed.checks``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, overload

from testbed.core.registry import CHECKS
from testbed.report.check_result import FAIL, UNKNOWN, CheckResult, Events
from testbed.report.integrity_checks import INTEGRITY
from testbed.report.partition_checks import PARTITION, partition_checks
from testbed.report.preemption_checks import PREEMPTION, preemption_checks
from testbed.report.recovery_checks import (
    check_detection,
    check_failures,
    check_goodput,
    check_learned_timeouts,
    check_recovered,
    check_recovery_time,
)
from testbed.report.resume_checks import check_checkpoint_complete, check_matches_uninterrupted
from testbed.report.serving_checks import SERVING
from testbed.scenario.expect import Expect

__all__ = ["Check", "CheckResult", "declared", "register_check", "run_checks", "verdict"]


#: a check: the journal and the scenario's expect in, a result out
Check = Callable[[Events, Expect], CheckResult]


@overload
def register_check(name: str) -> Callable[[Check], Check]: ...


@overload
def register_check(name: str, check: Check) -> Check: ...


def register_check(name: str, check: Check | None = None) -> Check | Callable[[Check], Check]:
    """Make ``check`` run in every run's report (after the built-in ones), under ``name``; without
    ``check``, a decorator that does so. A check is a pure function of the journal's events and the
    scenario's ``expect`` that returns a :class:`CheckResult` named ``name``."""
    if check is None:
        return lambda fn: register_check(name, fn)
    registered: Check = CHECKS.register(name, check)
    return registered


#: the testbed's checks, in the order every report lists them (others follow, as they were found)
BUILT_IN: tuple[tuple[str, Check], ...] = (
    ("recovered", check_recovered),
    ("recovery_time", check_recovery_time),
    ("checkpoint_complete", check_checkpoint_complete),
    ("matches_uninterrupted", check_matches_uninterrupted),
    ("failures", check_failures),
    ("goodput", check_goodput),
    ("detection", check_detection),
    ("learned_timeouts", check_learned_timeouts),
)
for _name, _check in (*BUILT_IN, *SERVING, *INTEGRITY, *PREEMPTION, *PARTITION):
    register_check(_name, _check)


def run_checks(events: Events, expect: Expect) -> list[CheckResult]:
    """Every check: the testbed's for the kind of run (training's, or a serving run's; with the
    integrity checks when the journal holds an ``integrity`` event, the preemption checks when it
    holds a ``preempt_notice``, the partition checks when it holds a partition) in a fixed order,
    then the others in the order they were found (however the registry was first read)."""
    start = next((e for e in events if e.get("event") == "serve_start"), None)
    serving, training = start is not None, start is None or bool(start.get("colocated"))
    integrity = any(e.get("event") == "integrity" for e in events)
    own = [
        name
        for name, _ in (
            *(BUILT_IN if training else ()),
            *(SERVING if serving else ()),
            *(INTEGRITY if integrity else ()),
            *preemption_checks(events),
            *partition_checks(events),
        )
    ]
    testbed_own = {name for name, _ in (*BUILT_IN, *SERVING, *INTEGRITY, *PREEMPTION, *PARTITION)}
    names = [*own, *(name for name in CHECKS if name not in testbed_own)]
    return [CHECKS[name](events, expect) for name in names]


def verdict(results: list[CheckResult]) -> tuple[str, int]:
    """(verdict, exit code): any fail is 1, else any unknown is 2, else pass 0."""
    statuses = {r.status for r in results}
    if FAIL in statuses:
        return "fail", 1
    if UNKNOWN in statuses:
        return "unknown", 2
    return "pass", 0


def declared(expect: Expect, outcome: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether a run came to the verdict its scenario declares (``expect.verdict``), failing exactly
    the checks it names (``expect.fails``), with the reason when it did not.

    ``outcome`` is the run's verdict and ``results`` its checks as the report holds them. A scenario
    that declares nothing declares a pass.
    """
    failed = [r["name"] for r in results if r["status"] == FAIL]
    want = list(expect.fails)
    why = ""
    if outcome != expect.verdict:
        why = f"the run's verdict is {outcome}, the scenario declares {expect.verdict}"
        if failed:
            why += f" (failed: {', '.join(failed)})"
    elif want and set(failed) != set(want):
        unexpected = [n for n in failed if n not in want]
        missed = [n for n in want if n not in failed]
        parts = [f"{', '.join(missed)} did not fail" if missed else ""]
        parts.append(f"{', '.join(unexpected)} failed too" if unexpected else "")
        why = "; ".join(p for p in parts if p) + f" (declared to fail: {', '.join(want)})"
    return {
        "verdict": expect.verdict,
        "fails": want,
        "got": outcome,
        "failed": failed,
        "as_declared": not why,
        "why": why,
    }
