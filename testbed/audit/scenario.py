"""The resume audit as a scenario file, for ``testbed run`` and ``testbed suite``.

A scenario whose workload is ``program`` is an audit::

    version: 1
    name: audit_control_torch
    tags: [audit]
    workload: {name: program, entry: workloads.programs.control_torch, options: {}}
    audit: {ranks: 2, steps: 8, kill_points: [before_forward, in_save], kill_steps: [4], seeds: [0, 1]}
    expect: {verdict: fail, component: scheduler}

``entry`` is a dotted module or a file path relative to the scenario file.
``expect.verdict`` is ``pass`` (every case resumes bit for bit) or ``fail``
(some case diverges); ``expect.component``, with ``fail``, is the Stateful the
first divergence must name.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.audit.plan import KILL_POINTS, AuditPlan
from testbed.audit.sweep import EXIT_DIVERGED, EXIT_PASS, AuditResult, audit_resume, table
from testbed.core.errors import ScenarioError
from testbed.scenario.source import Source, load
from workloads.program import resolve

_TOP = ("version", "name", "description", "tags", "workload", "audit", "expect", "seed")
_WORKLOAD = ("name", "entry", "options", "flops", "timeout_s")
_AUDIT = ("ranks", "steps", "kill_points", "kill_steps", "seeds", "save_every", "victim")
_EXPECT = ("verdict", "component", "fails")


@dataclass(frozen=True)
class AuditScenario:
    """A validated audit scenario: its plan and what it declares."""

    name: str
    file: str
    plan: AuditPlan
    verdict: str = "pass"
    component: str = ""
    description: str = ""
    tags: tuple[str, ...] = ()
    seed: int = 0
    warnings: tuple[str, ...] = field(default=())

    def declared(self) -> str:
        """What it declares, as a suite row shows it."""
        if self.verdict != "fail":
            return "pass"
        return f"fail (resume_audit: {self.component})" if self.component else "fail (resume_audit)"


def is_audit(path: str | Path) -> bool:
    """Whether the scenario file at ``path`` names the ``program`` workload (a cheap look)."""
    try:
        src = load(Path(path).read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, ScenarioError):
        return False
    workload = src.data.get("workload") if isinstance(src.data, dict) else None
    return isinstance(workload, dict) and workload.get("name") == "program"


def _mapping(
    src: Source, raw: Any, where: tuple[str, ...], keys: tuple[str, ...], problems: list[str]
) -> dict[str, Any]:
    at = f"{src.file}:{src.line(where) or 1}: {'.'.join(where) or 'the file'}"
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(f"{at}: is a {type(raw).__name__}; write a mapping")
        return {}
    for key in raw:
        if key not in keys:
            problems.append(f"{at}: unknown field {key!r}; the fields are {', '.join(keys)}")
    return raw


def _ints(raw: Any, name: str, problems: list[str]) -> tuple[int, ...]:
    values = raw if isinstance(raw, list) else [raw]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        problems.append(f"audit.{name}: {raw!r} is not a list of integers; write e.g. [4] or [2, 5]")
        return ()
    return tuple(values)


def parse_audit(text: str, file: str) -> AuditScenario:
    """Read and validate an audit scenario; a :class:`ScenarioError` names every problem."""
    src = load(text, file)
    problems: list[str] = []
    top = _mapping(src, src.data, (), _TOP, problems)
    workload = _mapping(src, top.get("workload"), ("workload",), _WORKLOAD, problems)
    audit = _mapping(src, top.get("audit"), ("audit",), _AUDIT, problems)
    expect = _mapping(src, top.get("expect"), ("expect",), _EXPECT, problems)
    entry = workload.get("entry")
    if not isinstance(entry, str) or not entry:
        problems.append(
            f"{file}: workload.entry: name your program, e.g. entry: workloads.programs.control_torch"
        )
        entry = ""
    options = workload.get("options") or {}
    if not isinstance(options, dict):
        problems.append(f"{file}: workload.options: write a mapping (handed to your factory)")
        options = {}
    points = audit.get("kill_points", list(KILL_POINTS))
    if not isinstance(points, list) or not all(isinstance(p, str) for p in points):
        problems.append(f"{file}: audit.kill_points: write a list, e.g. [before_forward, in_save]")
        points = list(KILL_POINTS)
    verdict = expect.get("verdict", "pass")
    if verdict not in ("pass", "fail"):
        problems.append(f"{file}: expect.verdict: {verdict!r}; write pass or fail")
    component = str(expect.get("component") or "")
    if component and verdict != "fail":
        problems.append(f"{file}: expect.component: only with verdict: fail (the component it must name)")
    plan = AuditPlan(
        entry=resolve(entry, Path(file).parent) if entry else "",
        ranks=_int(audit, "ranks", 2, problems),
        steps=_int(audit, "steps", 8, problems),
        kill_points=tuple(points),
        kill_steps=_ints(audit["kill_steps"], "kill_steps", problems) if "kill_steps" in audit else (),
        seeds=_ints(audit["seeds"], "seeds", problems)
        if "seeds" in audit
        else (_int(top, "seed", 0, problems),),
        save_every=_int(audit, "save_every", 1, problems),
        victim=_int(audit, "victim", -1, problems) if "victim" in audit else None,
        options=options,
        flops=float(workload.get("flops") or 1e12),
        timeout_s=float(workload.get("timeout_s") or 60.0),
    )
    problems.extend(f"{file}: audit: {p}" for p in plan.problems())
    name = top.get("name")
    if not isinstance(name, str) or not name:
        problems.append(f"{file}: name: give the scenario a name")
    if problems:
        raise ScenarioError(
            f"{file}: {len(problems)} problem(s):\n  " + "\n  ".join(problems), problems=problems
        )
    tags = top.get("tags") or []
    return AuditScenario(
        name=str(name),
        file=file,
        plan=plan,
        verdict=str(verdict),
        component=component,
        description=str(top.get("description") or ""),
        tags=tuple(str(t) for t in (tags if isinstance(tags, list) else [tags])),
        seed=plan.seeds[0],
    )


def _int(raw: dict[str, Any], key: str, default: int, problems: list[str]) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"{key}: {value!r} is not an integer")
        return default
    return value


def load_audit(path: str | Path) -> AuditScenario:
    """Read and validate the audit scenario at ``path``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{p}: cannot read the scenario file ({exc}); check the path") from None
    return parse_audit(text, str(p))


@dataclass(frozen=True)
class AuditRun:
    """An audit scenario's run, held to what it declares."""

    scenario: AuditScenario
    result: AuditResult
    got: str
    as_declared: bool
    why: str
    out_dir: Path
    wall_s: float

    @property
    def exit_code(self) -> int:
        """As ``testbed run`` exits: the audit's own code (0 pass, 1 diverged, 254 cannot judge)."""
        return self.result.exit_code


def run_audit(scenario: AuditScenario, out: Path) -> AuditRun:
    """Run the audit scenario under ``out``; write ``summary.txt`` beside the audit's files."""
    t0 = time.monotonic()
    result = audit_resume(scenario.plan, out)
    first = next((c.verdict.divergence for c in result.cases if c.verdict.divergence), None)
    if result.exit_code == EXIT_PASS:
        got = "pass"
    elif result.exit_code == EXIT_DIVERGED:
        got = "fail (resume_audit" + (f": {first.component})" if first else ")")
    else:
        got = "cannot judge"
    wanted_component = scenario.component or (first.component if first else "")
    as_declared = (scenario.verdict == "pass" and got == "pass") or (
        scenario.verdict == "fail"
        and result.exit_code == EXIT_DIVERGED
        and first is not None
        and first.component == wanted_component
    )
    why = (
        ""
        if as_declared
        else f"declared {scenario.declared()}, got {got}" + (f": {result.problem}" if result.problem else "")
    )
    summary = table(result)
    (out / "summary.txt").write_text(summary + "\n")
    (out / "declared.json").write_text(
        json.dumps({"declared": scenario.declared(), "got": got, "as_declared": as_declared, "why": why})
    )
    return AuditRun(scenario, result, got, as_declared, why, out, time.monotonic() - t0)
