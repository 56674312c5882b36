"""The resume audit's sweep: two uninterrupted runs, then one killed-and-resumed run per case.

Everything it learns goes to ``journal.jsonl`` as it happens (a failure
midway still leaves what was found), then to ``report.json``, a table and
``junit.xml`` (one test case per kill point and step).
"""

from __future__ import annotations

import json
import shutil
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.audit.plan import KILL_POINTS, AuditPlan
from testbed.audit.segments import RankPool, Segment, Stretch, run_segment
from testbed.audit.store import newest
from testbed.audit.verdict import Verdict, first_divergence, judge
from testbed.core.errors import ScenarioError
from testbed.core.interrupts import interruptible

#: exit codes: every case passed, a case diverged, the audit could not judge (bad program or input)
EXIT_PASS, EXIT_DIVERGED, EXIT_INVALID = 0, 1, 254


@dataclass
class CaseResult:
    """One kill and resume, judged."""

    seed: int
    point: str
    step: int
    verdict: Verdict
    death: dict[str, Any] | None
    resumed_at: int | None
    wall_s: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        d = self.verdict.divergence
        return {
            "seed": self.seed,
            "point": self.point,
            "step": self.step,
            "status": self.verdict.status,
            "verdict": self.verdict.describe(),
            "divergence": d.as_dict() if d else None,
            "death": self.death,
            "resumed_at": self.resumed_at,
            "wall_s": round(self.wall_s, 3),
        }


@dataclass
class AuditResult:
    """Every case, the costs, and the exit code."""

    plan: AuditPlan
    cases: list[CaseResult] = field(default_factory=list)
    #: why the audit could not judge (a program that raised, hung, or is not the same run twice)
    problem: str = ""
    wall_s: float = 0.0
    costs: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0 every case passed, 1 a case diverged, 254 the audit could not judge."""
        if self.problem or any(c.verdict.status == "undecided" for c in self.cases):
            return EXIT_INVALID
        return EXIT_DIVERGED if any(c.verdict.status == "diverged" for c in self.cases) else EXIT_PASS

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``report.json``)."""
        return {
            "plan": self.plan.as_dict(),
            "cases": [c.as_dict() for c in self.cases],
            "problem": self.problem,
            "exit_code": self.exit_code,
            "wall_s": round(self.wall_s, 3),
            "costs": self.costs,
        }


class Journal:
    """``journal.jsonl``: one event per line, written as it happens."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_text("")

    def write(self, event: str, **fields: Any) -> None:
        """Append one event."""
        with self.path.open("a") as f:
            f.write(json.dumps({"event": event, **fields}, sort_keys=True) + "\n")


def audit_resume(plan: AuditPlan, out: Path) -> AuditResult:
    """Run the audit of ``plan`` with its files under ``out``; never raises for the program's faults:
    they end the audit with :attr:`AuditResult.problem` set (exit 254)."""
    plan.checked()
    out.mkdir(parents=True, exist_ok=True)
    journal = Journal(out / "journal.jsonl")
    journal.write("audit_started", plan=plan.as_dict())
    result = AuditResult(plan)
    t0 = time.monotonic()
    # Ctrl-C stops the audit as at a terminal, even if this process inherited it ignored
    with interruptible(), (out / "ranks.log").open("ab") as log:
        runs = len(plan.seeds) * (1 + plan.twin_run) + 2 * len(plan.cases())
        pool = RankPool(plan.entry, log, needed=runs * plan.ranks, start=plan.start)
        try:
            for seed in plan.seeds:
                if not _audit_seed(pool, plan, seed, out / f"seed{seed}", journal, result):
                    break
        except ScenarioError as exc:
            result.problem = exc.message
        except BaseException as exc:  # a testbed bug or Ctrl-C: what was found is still written
            result.problem = f"the audit stopped: {type(exc).__name__}: {exc}"
            raise
        finally:
            pool.close()
            _finish(result, pool, journal, out, time.monotonic() - t0)
    return result


def _finish(result: AuditResult, pool: RankPool, journal: Journal, out: Path, wall_s: float) -> None:
    """The costs, the journal's last event, ``report.json`` and ``junit.xml``."""
    result.wall_s = wall_s
    result.costs = {
        "processes": pool.started,
        "start": result.plan.start,
        "zygote_s": round(pool.zygote_s, 3),
        "import_s_mean": round(sum(pool.import_s) / max(1, len(pool.import_s)), 3),
        **result.costs,
    }
    journal.write("audit_finished", exit_code=result.exit_code, problem=result.problem, wall_s=result.wall_s)
    (out / "report.json").write_text(json.dumps(result.as_dict(), indent=2, sort_keys=True))
    write_junit(result, out / "junit.xml")


def _audit_seed(
    pool: RankPool, plan: AuditPlan, seed: int, folder: Path, journal: Journal, result: AuditResult
) -> bool:
    """The two uninterrupted runs of ``seed`` and its cases; False if the program is not deterministic."""
    shutil.rmtree(folder, ignore_errors=True)
    reference = run_segment(pool, plan, Stretch(seed, folder / "reference"))
    journal.write(
        "reference", seed=seed, wall_s=reference.wall_s, losses=_losses(reference), steps=plan.steps
    )
    differ = None
    if plan.twin_run:
        twin = run_segment(pool, plan, Stretch(seed, folder / "twin"))
        differ = first_divergence(reference.boundaries, twin.boundaries, "before_kill")
    if differ is not None:
        result.problem = (
            f"cannot judge the resume: two uninterrupted runs of seed {seed} differ ({differ.leaf} "
            f"{differ.values()} at step {differ.boundary} on rank {differ.rank}); make the program the "
            "same run twice: seed every generator it draws from, and avoid non-deterministic kernels"
        )
        journal.write("not_deterministic", seed=seed, divergence=differ.as_dict())
        return False
    result.costs.setdefault("reference_s", reference.wall_s)
    for _, point, step in [c for c in plan.cases() if c[0] == seed]:
        case = _case(pool, plan, seed, point, step, folder / f"{point}-step{step}", reference)
        result.cases.append(case)
        journal.write("case", **case.as_dict())
    return True


def _case(
    pool: RankPool, plan: AuditPlan, seed: int, point: str, step: int, folder: Path, reference: Segment
) -> CaseResult:
    """Kill the victim at ``point`` of ``step``, restart every rank fresh from the newest committed
    checkpoint, run to the end, and judge."""
    kill = {"rank": plan.victim_rank, "step": step, "point": point}
    killed = run_segment(pool, plan, Stretch(seed, folder, kill=kill))
    found = newest(folder)
    first, resume = (found[0], found[1]) if found else (0, None)
    resumed = run_segment(pool, plan, Stretch(seed, folder, first=first, resume=resume, epoch=1))
    died_in = int((killed.death or {}).get("step", step))
    before = {b: v for b, v in killed.boundaries.items() if b <= died_in}
    verdict = judge(reference.boundaries, before, resumed.resumed_at, resumed.loaded, resumed.boundaries)
    return CaseResult(
        seed, point, step, verdict, killed.death, resumed.resumed_at, killed.wall_s + resumed.wall_s
    )


def _losses(segment: Segment) -> list[float | None]:
    return [segment.losses[b].get(0) for b in sorted(segment.losses) if b > 0]


def table(result: AuditResult) -> str:
    """The audit as a table: one row per case, its verdict and first divergence."""
    plan = result.plan
    lines = [
        f"resume audit of {plan.entry}: {plan.ranks} rank(s), {plan.steps} steps, a checkpoint every "
        f"{plan.save_every} step(s), rank {plan.victim_rank} killed",
        f"  {'seed':>4}  {'kill point':15} {'step':>4}  {'verdict':9} first divergence",
    ]
    for c in result.cases:
        death = c.death or {}
        killed = f"killed in step {death.get('step', c.step)}" + (
            f" ({death['detail']})" if death.get("detail") else ""
        )
        if c.verdict.status == "pass":
            first = f"{killed}; resumed from step {c.resumed_at or 0}: every leaf equal at every step"
        else:
            first = f"{killed}; {c.verdict.describe()}"
        lines.append(f"  {c.seed:>4}  {c.point:15} {c.step:>4}  {c.verdict.status.upper():9} {first}")
    if result.problem:
        lines.append(f"  cannot judge: {result.problem}")
    passed = sum(c.verdict.status == "pass" for c in result.cases)
    lines.append(
        f"{passed} of {len(result.cases)} case(s) resumed bit for bit in {result.wall_s:.1f} s "
        f"({result.costs.get('processes', 0)} rank processes)"
    )
    return "\n".join(lines)


def write_junit(result: AuditResult, path: Path) -> Path:
    """One JUnit test case per case (a divergence is a failure; an undecided case or a problem, an
    error)."""
    suite = ET.Element("testsuite", name="resume_audit", tests=str(len(result.cases)))
    failures = errors = 0
    for c in result.cases:
        tc = ET.SubElement(
            suite, "testcase", classname=f"resume_audit.seed{c.seed}", name=f"{c.point}@step{c.step}"
        )
        tc.set("time", f"{c.wall_s:.3f}")
        if c.verdict.status == "diverged":
            failures += 1
            ET.SubElement(tc, "failure", message=c.verdict.describe())
        elif c.verdict.status == "undecided":
            errors += 1
            ET.SubElement(tc, "error", message=c.verdict.describe())
    if result.problem:
        errors += 1
        tc = ET.SubElement(suite, "testcase", classname="resume_audit", name="audit")
        ET.SubElement(tc, "error", message=result.problem)
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    ET.ElementTree(suite).write(path, encoding="unicode", xml_declaration=True)
    return path


__all__ = ["KILL_POINTS", "AuditResult", "audit_resume", "table", "write_junit"]
