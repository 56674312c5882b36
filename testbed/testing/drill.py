"""Seeded chaos drills: draw fault schedules against a base scenario, run them, shrink a failure.

``testbed drill SCENARIO --seed N --budget 5m`` draws schedules from
:func:`testbed.testing.schedules.fault_schedules` with Hypothesis, seeded by ``N``,
and runs each on the cluster until the budget is spent (or, with
``--schedules K``, until ``K`` schedules have run, whichever comes first). An example fails when
the run's verdict is not pass (the scenario's ``expect``), when one of the
invariants of :mod:`testbed.report.invariants` does not hold, or, with
``--check-determinism``, when two runs of it differ in plan, virtual times or
final parameters. On the first failure Hypothesis shrinks the schedule
(fewer faults, earlier steps, plainer kinds), for at most the budget again;
the smallest failing schedule is written as a plain scenario file with the
one command that replays it.

The same seed draws the same schedules in the same order (Hypothesis runs
derandomised from the seed, with no example database); what a budget reaches
depends on the machine's speed, so a drill is replayed from its minimal file,
not from its seed. ``--schedules K`` with a budget the machine never reaches
runs the same ``K`` schedules on any machine, however loaded (what CI wants).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from random import Random
from typing import Any
from xml.etree import ElementTree as ET

from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample

from testbed.core.journal import read_journal
from testbed.report.html_suite import drill_page
from testbed.report.invariants import broken
from testbed.scenario.model import Scenario
from testbed.scenario.parse import parse_scenario
from testbed.testing.schedules import SCHEDULE_KINDS, fault_schedules, scenario_yaml


@dataclass(frozen=True)
class Example:
    """One drawn schedule and what its run came to."""

    index: int
    faults: list[dict[str, Any]]
    exit_code: int
    verdict: str
    #: invariant (or ``expect``, ``determinism``) -> what went wrong
    problems: dict[str, list[str]]
    run_dir: Path
    wall_s: float

    @property
    def failed(self) -> bool:
        """Whether this example breaks something."""
        return bool(self.problems)


@dataclass
class Drill:
    """A drill in progress: its base, its budget, the examples run so far."""

    base: Scenario
    seed: int
    budget_s: float
    out_dir: Path
    max_faults: int = 3
    check_determinism: bool = False
    kinds: tuple[str, ...] = SCHEDULE_KINDS
    #: at most this many schedules drawn before the first failure (None: the budget alone ends it)
    schedules: int | None = None
    examples: list[Example] = field(default_factory=list)
    _cache: dict[str, Example] = field(default_factory=dict)
    _t0: float = field(default_factory=time.monotonic)
    _first_failure: float | None = None

    def _over_budget(self) -> bool:
        now = time.monotonic()
        if self._first_failure is None:
            drawn_all = self.schedules is not None and len(self.examples) >= self.schedules
            return drawn_all or now - self._t0 > self.budget_s
        return now - self._first_failure > self.budget_s  # the shrink gets the budget again

    def example_of(self, schedule: list[dict[str, Any]]) -> Example | None:
        """The example ``schedule`` was run as, if it was."""
        return self._cache.get(json.dumps(schedule, sort_keys=True))

    def fails(self, schedule: list[dict[str, Any]]) -> bool:
        """Run ``schedule`` (once per distinct schedule) and say whether it breaks something; past the
        budget (or the count of schedules), end the search (:class:`BudgetSpent`) rather than let
        Hypothesis draw on for nothing."""
        key = json.dumps(schedule, sort_keys=True)
        if key in self._cache:
            return self._cache[key].failed
        if self._over_budget():
            raise BudgetSpent
        example = self._run(schedule)
        self._cache[key] = example
        self.examples.append(example)
        if example.failed and self._first_failure is None:
            self._first_failure = time.monotonic()
        return example.failed

    def _run(self, schedule: list[dict[str, Any]]) -> Example:
        from testbed.control.runner import run

        index = len(self.examples) + 1
        scenario = parse_scenario(scenario_yaml(self.base, schedule), self.base.file)
        run_dir = self.out_dir / "examples" / f"{index:03d}"
        t0 = time.monotonic()
        result = run(scenario, run_dir)
        if result.verdict == "interrupted":  # Ctrl-C ends the drill, not just this example
            raise KeyboardInterrupt
        events = read_journal(run_dir / "journal.jsonl")
        problems = broken(events, run_dir)
        if result.verdict != "pass":
            failed = [c for c in result.data["checks"] if c["status"] == "fail"]
            problems["expect"] = [f"{c['name']}: {c['summary']}" for c in failed] or [
                f"verdict {result.verdict} (exit {result.exit_code}): {result.data.get('error')}"
            ]
        if self.check_determinism:
            again = run(scenario, run_dir.with_name(run_dir.name + "-again"))
            problems.update(differences(result.data, events, again.data, again.out_dir))
        example = Example(
            index, schedule, result.exit_code, result.verdict, problems, run_dir, time.monotonic() - t0
        )
        if not example.failed:  # keep the reports of failing examples only
            shutil.rmtree(run_dir, ignore_errors=True)
            shutil.rmtree(run_dir.with_name(run_dir.name + "-again"), ignore_errors=True)
        return example


def differences(
    report: dict[str, Any], events: list[dict[str, Any]], other: dict[str, Any], other_dir: Path
) -> dict[str, list[str]]:
    """What differs between two runs of one scenario and seed: plan, virtual times, final parameters."""
    again = read_journal(other_dir / "journal.jsonl")
    found = []
    if report.get("plan_sha256") != other.get("plan_sha256"):
        found.append(f"plan {report.get('plan_sha256')} != {other.get('plan_sha256')}")
    times = [str((e["phase"], e["step"], e["t"])) for e in events if e.get("event") == "step_end"]
    times_again = [str((e["phase"], e["step"], e["t"])) for e in again if e.get("event") == "step_end"]
    if times != times_again:
        at = next(
            i for i in range(max(len(times), len(times_again))) if times[i : i + 1] != times_again[i : i + 1]
        )
        first, second = times[at : at + 1] or ["(none)"], times_again[at : at + 1] or ["(none)"]
        found.append(f"virtual times differ, first at {first[0]} vs {second[0]}")
    if report.get("final_digest") != other.get("final_digest"):
        found.append(f"final parameters differ: {report.get('final_digest')} != {other.get('final_digest')}")
    return {"determinism": found} if found else {}


class BudgetSpent(Exception):
    """The drill's budget is spent: the search ends with what it has run (10,000 more draws refused
    one by one cost half a minute)."""


@dataclass(frozen=True)
class DrillResult:
    """What a drill came to: every example, and the smallest failing one if any failed."""

    seed: int
    examples: list[Example]
    minimal: Example | None
    minimal_file: Path | None
    replay: str | None

    @property
    def exit_code(self) -> int:
        """0: nothing failed within the budget; 1: a failing schedule was found."""
        return 1 if self.minimal is not None else 0


def run_drill(
    base: Scenario,
    seed: int,
    budget_s: float,
    out_dir: Path,
    max_faults: int = 3,
    check_determinism: bool = False,
    kinds: tuple[str, ...] = SCHEDULE_KINDS,
    schedules: int | None = None,
) -> DrillResult:
    """Draw, run and (on a failure) shrink fault schedules against ``base``; write the results. With
    ``schedules``, the search ends after that many (the shrink of a failure still has the budget)."""
    from testbed.actors.session import RaySession

    out_dir.mkdir(parents=True, exist_ok=True)
    drill = Drill(base, seed, budget_s, out_dir, max_faults, check_determinism, kinds, schedules)
    config = settings(
        max_examples=10_000,  # the budget (or the drill's own count) ends the search
        database=None,
        deadline=None,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    minimal: Example | None = None
    try:
        with RaySession():
            schedule = find(
                fault_schedules(base, max_faults, kinds), drill.fails, settings=config, random=Random(seed)
            )
            minimal = drill.example_of(schedule)
    except NoSuchExample:
        minimal = None
    except BudgetSpent:  # the smallest failing schedule run before the budget ran out, if any
        minimal = _smallest_failing(drill)
    except KeyboardInterrupt:  # what ran so far is written, then the interrupt goes on
        _write(drill, _smallest_failing(drill))
        raise
    return _write(drill, minimal)


def _smallest_failing(drill: Drill) -> Example | None:
    """The failing example with the fewest faults (the first of those), or None."""
    failing = [e for e in drill.examples if e.failed]
    return min(failing, key=lambda e: len(e.faults)) if failing else None


def _write(drill: Drill, minimal: Example | None) -> DrillResult:
    out = drill.out_dir
    minimal_file = replay = None
    if minimal is not None:
        name = f"{drill.base.name}-drill-{drill.seed}"
        minimal_file = out / "minimal.yaml"
        header = (
            f"# The smallest failing schedule drill seed {drill.seed} found against {drill.base.file}\n"
            f"# ({len(minimal.faults)} fault(s); example {minimal.index:03d}). It failed:\n"
            + "".join(f"#   {k}: {p[0]}\n" for k, p in minimal.problems.items())
        )
        minimal_file.write_text(header + scenario_yaml(drill.base, minimal.faults, name), encoding="utf-8")
        replay = f"testbed run {minimal_file}"
    result = DrillResult(drill.seed, drill.examples, minimal, minimal_file, replay)
    as_json = _as_json(result)
    (out / "drill.json").write_text(json.dumps(as_json, indent=1, default=str), encoding="utf-8")
    minimal_yaml = minimal_file.read_text(encoding="utf-8") if minimal_file else None
    (out / "drill.html").write_text(drill_page(as_json, out, minimal_yaml), encoding="utf-8")
    _junit(result, out / "junit.xml")
    return result


def _as_json(result: DrillResult) -> dict[str, Any]:
    def one(e: Example) -> dict[str, Any]:
        return {
            "index": e.index,
            "faults": e.faults,
            "verdict": e.verdict,
            "exit_code": e.exit_code,
            "problems": e.problems,
            "run_dir": str(e.run_dir) if e.failed else None,
            "wall_s": round(e.wall_s, 3),
        }

    return {
        "seed": result.seed,
        "examples": [one(e) for e in result.examples],
        "failed": sum(e.failed for e in result.examples),
        "minimal": one(result.minimal) if result.minimal else None,
        "minimal_file": str(result.minimal_file) if result.minimal_file else None,
        "replay": result.replay,
    }


def _junit(result: DrillResult, path: Path) -> None:
    failures = sum(e.failed for e in result.examples)
    suite = ET.Element(
        "testsuite", name=f"drill-seed-{result.seed}", tests=str(len(result.examples)), failures=str(failures)
    )
    for e in result.examples:
        case = ET.SubElement(
            suite, "testcase", classname="drill", name=f"example-{e.index:03d}", time=f"{e.wall_s:.3f}"
        )
        if e.failed:
            text = "\n".join(f"{k}: {p}" for k, ps in e.problems.items() for p in ps)
            failure = ET.SubElement(case, "failure", message=next(iter(e.problems.values()))[0][:200])
            failure.text = text + f"\nfaults: {json.dumps(e.faults)}\nreport: {e.run_dir}"
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


def render(result: DrillResult) -> str:
    """The drill's summary for the terminal."""
    failed = [e for e in result.examples if e.failed]
    lines = [
        f"drill seed {result.seed}: {len(result.examples)} schedule(s) run, {len(failed)} failing",
    ]
    if result.minimal is None:
        lines.append("no failing schedule found among them")
        return "\n".join(lines)
    m = result.minimal
    lines.append(f"smallest failing schedule ({len(m.faults)} fault(s)), example {m.index:03d}:")
    lines.extend(f"  - {json.dumps(f)}" for f in m.faults)
    lines.extend(f"  {k}: {p[0]}" for k, p in m.problems.items())
    lines.append(f"written to {result.minimal_file}")
    lines.append(f"replay: {result.replay}")
    if result.minimal_file is not None:
        lines.append(f"page: {result.minimal_file.with_name('drill.html')} (open it in a browser)")
    return "\n".join(lines)
