"""A folder of scenarios as a regression suite: each run held to the verdict its scenario declares.

A scenario that demonstrates a wrong policy declares it (``expect: {verdict:
fail, fails: [checkpoint_complete]}``); one that shows a healthy recovery
declares nothing (a pass). :func:`run_suite` runs every chosen scenario in one
Ray session and says, for each, whether it came to what it declares: a
scenario meant to fail that passes, fails another check, or is aborted is a
failure of the suite, named with the reason. Every file is validated before
anything starts, and every problem of every file is reported at once.
"""

from __future__ import annotations

import contextlib
import json
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from testbed.audit.scenario import AuditScenario, is_audit, load_audit, run_audit
from testbed.core.errors import ScenarioError
from testbed.scenario.model import Scenario
from testbed.scenario.parse import load_scenario

#: a suite's scenario: a run of the testbed's own workloads, or a resume audit of a program
AnyScenario = Scenario | AuditScenario


def scenario_files(paths: Iterable[str | Path]) -> list[Path]:
    """The scenario files named, a folder standing for its ``*.yaml`` files (sorted), each once."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(sorted(path.glob("*.yaml")))
        elif path.is_file():
            found.append(path)
        else:
            raise ScenarioError(
                f"{path}: no such scenario file or folder; give YAML files or a folder of them"
            )
    unique: dict[Path, Path] = {}
    for p in found:
        unique.setdefault(p.resolve(), p)
    if not unique:
        raise ScenarioError("no scenario files there; a suite runs *.yaml files, or a folder of them")
    return list(unique.values())


def load_suite(files: list[Path]) -> list[AnyScenario]:
    """Every file validated; one :class:`ScenarioError` with every problem of every file, if any."""
    scenarios: list[AnyScenario] = []
    problems: list[str] = []
    for path in files:
        try:
            scenarios.append(load_audit(path) if is_audit(path) else load_scenario(path))
        except ScenarioError as exc:
            problems.extend(exc.fields.get("problems") or [str(exc)])
    if problems:
        bad = len(files) - len(scenarios)
        head = f"{bad} of {len(files)} scenario file(s) are invalid; nothing was started."
        raise ScenarioError(head + "\n  " + "\n  ".join(problems), problems=problems)
    return scenarios


def with_tags(scenarios: list[AnyScenario], tags: list[str]) -> list[AnyScenario]:
    """The scenarios carrying any of ``tags`` (all of them when ``tags`` is empty)."""
    if not tags:
        return scenarios
    chosen = [s for s in scenarios if set(s.tags) & set(tags)]
    if not chosen:
        known = sorted({t for s in scenarios for t in s.tags})
        raise ScenarioError(
            f"no scenario carries the tag(s) {', '.join(tags)}; "
            f"the tags in use are {', '.join(known) or 'none'}"
        )
    return chosen


@dataclass(frozen=True)
class SuiteRow:
    """One scenario's run, against what it declares."""

    scenario: str
    file: str
    tags: tuple[str, ...]
    declared: str
    got: str
    failed: tuple[str, ...]
    as_declared: bool
    why: str
    exit_code: int
    wall_s: float
    run_dir: str


def _declared(scenario: AnyScenario) -> str:
    if isinstance(scenario, AuditScenario):
        return scenario.declared()
    e = scenario.expect
    return e.verdict + (f" ({', '.join(e.fails)})" if e.fails else "")


def run_suite(
    scenarios: list[AnyScenario],
    out_dir: Path,
    address: str | None = None,
    on_row: Callable[[SuiteRow], None] | None = None,
) -> list[SuiteRow]:
    """Run each scenario under ``out_dir/STEM``, the testbed's runs in one Ray session (started only
    if there is one; those that share a reference run run it once) and resume audits on their own
    processes; a row per scenario (``on_row`` is told of each as it ends)."""
    from testbed.actors.session import RaySession
    from testbed.control.shared_reference import repeated, shared_references

    rows = []
    runs = [s for s in scenarios if isinstance(s, Scenario)]
    with RaySession(address) if runs else contextlib.nullcontext(), shared_references(repeated(runs)):
        for scenario in scenarios:
            row = _run_one(scenario, out_dir, address)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


def _run_one(scenario: AnyScenario, out_dir: Path, address: str | None) -> SuiteRow:
    from testbed.control.runner import run

    stem = Path(scenario.file).stem or scenario.name
    wall0 = time.monotonic()
    if isinstance(scenario, AuditScenario):
        audit = run_audit(scenario, out_dir / stem)
        got, failed = audit.got, (("resume_audit",) if audit.got.startswith("fail") else ())
        as_declared, why, code, run_dir = audit.as_declared, audit.why, audit.exit_code, audit.out_dir
    else:
        result = run(scenario, out_dir / stem, address=address)
        d = result.data["declared"]
        got = d["got"] + (f" ({', '.join(d['failed'])})" if d["failed"] else "")
        failed, as_declared, why = tuple(d["failed"]), bool(d["as_declared"]), str(d["why"])
        code, run_dir = result.exit_code, result.out_dir
    return SuiteRow(
        scenario=scenario.name,
        file=scenario.file,
        tags=scenario.tags,
        declared=_declared(scenario),
        got=got,
        failed=failed,
        as_declared=as_declared,
        why=why,
        exit_code=code,
        wall_s=round(time.monotonic() - wall0, 1),
        run_dir=str(run_dir),
    )


def exit_code(rows: list[SuiteRow]) -> int:
    """0 when every scenario came to what it declares, else 1."""
    return 0 if all(r.as_declared for r in rows) else 1


def table(rows: list[SuiteRow]) -> str:
    """The rows as an aligned text table, the scenarios not as declared named beneath."""
    head = ("scenario", "declared", "got", "ok", "wall")
    cells = [
        (r.scenario, r.declared, r.got, "yes" if r.as_declared else "NO", f"{r.wall_s:.1f} s") for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    line = "  ".join(f"{{:{w}}}" for w in widths)
    out = [line.format(*head).rstrip()] + [line.format(*c).rstrip() for c in cells]
    wrong = [r for r in rows if not r.as_declared]
    out.append(
        f"{len(rows) - len(wrong)} of {len(rows)} scenario(s) came to what they declare"
        + ("" if not wrong else "; not as declared:")
    )
    out.extend(f"  {r.scenario} ({r.file}): {r.why}; see {r.run_dir}" for r in wrong)
    return "\n".join(out)


def junit_xml(rows: list[SuiteRow]) -> str:
    """One JUnit test case per scenario: a failure when it did not come to what it declares."""
    wrong = sum(1 for r in rows if not r.as_declared)
    suite = ET.Element(
        "testsuite",
        name="testbed.testing.suite",
        tests=str(len(rows)),
        failures=str(wrong),
        errors="0",
        time=f"{sum(r.wall_s for r in rows):.1f}",
    )
    for r in rows:
        case = ET.SubElement(
            suite,
            "testcase",
            classname="testbed.testing.suite",
            name=r.scenario,
            file=r.file,
            time=f"{r.wall_s:.1f}",
        )
        text = f"declared {r.declared}, got {r.got}; run in {r.run_dir}"
        if r.as_declared:
            ET.SubElement(case, "system-out").text = text
        else:
            ET.SubElement(case, "failure", message=r.why).text = text
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def write(rows: list[SuiteRow], out_dir: Path, junit: Path | None = None) -> Path:
    """``suite.json`` and the JUnit file (``junit.xml`` in ``out_dir`` unless given); returns the latter."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "suite.json").write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    target = junit or out_dir / "junit.xml"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(junit_xml(rows))
    return target
