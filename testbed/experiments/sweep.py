"""Sweep one scenario field over values and measure goodput at each; for the checkpoint interval,
set the best measured value beside the Young/Daly optimum.

``testbed sweep SCENARIO --field policy.checkpoint.every --values 2,3,4,6,9
--mtbf 1h`` runs the scenario once per value, with only that field changed
(the same seed, so the same failures: a fault with ``at: {mtbf: ...}`` draws
its arrival times from its own stream, whatever the interval). ``--mtbf``
adds such a fault (``node_kill``, a random rank each time) to the scenario.

Young (1974): the compute time between checkpoints that maximises goodput
is ``tau = sqrt(2 * C * M)``, for checkpoint cost ``C`` and mean time between
failures ``M`` (Daly 2006 refines it to ``sqrt(2 C M) - C`` for ``C << M``).
``C`` is measured (the time a checkpoint holds training up: its write, or
its snapshot when asynchronous, averaged over every committed checkpoint of
the sweep), ``M`` is the job's MTBF (the processes' rates added), and the
optimum is given in steps by dividing by the measured mean step time.

Near the optimum the goodput curve is flat, and each failure's lost work
falls anywhere in its interval, so the single best measured value moves with
the seed. The sweep also fits Young's form, ``goodput = a - b / k - c k``
over the interval ``k`` in steps (least squares over every point), and
reports the fitted curve's maximum, ``sqrt(b / c)``: the measured optimum
with the noise of all the points averaged, not only the best one's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from testbed.actors.session import RaySession
from testbed.control.runner import run
from testbed.control.shared_reference import shared_references
from testbed.core.errors import ScenarioError
from testbed.core.journal import read_journal
from testbed.core.units import parse_duration
from testbed.report.plots import sweep_figure
from testbed.scenario import overrides
from testbed.scenario.model import Scenario
from testbed.scenario.parse import parse_scenario

INTERVAL = "policy.checkpoint.every"


def as_yaml(value: Any) -> str:
    """``value`` written as a one-line YAML value (what ``--set FIELD=VALUE`` reads back)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text[: -len("...")].strip() if text.endswith("...") else text


def with_field(text: str, file: str, field: str, value: Any, mtbf: float | None = None) -> Scenario:
    """The scenario of ``text`` with the dotted ``field`` set to ``value`` (and a Poisson kill process
    of ``mtbf`` seconds added to its faults), validated as any scenario is; the changes are the
    scenario's ``overrides``, so its replay line runs it as it ran."""
    sets = [f"{field}={as_yaml(value)}"]
    if mtbf is not None:
        raw = yaml.safe_load(text)
        faults = (raw.get("faults") if isinstance(raw, dict) else None) or []
        kill = {"kind": "node_kill", "target": {"mode": "random"}, "at": {"mtbf": mtbf}}
        sets.append(f"faults={as_yaml([*faults, kill])}")
    return overrides.apply(text, file, sets, flag="--field")


def job_mtbf(scenario: Scenario) -> float | None:
    """The job's mean time between failures from its Poisson fault entries (None: it has none)."""
    rates = [1.0 / float(parse_duration(f.at["mtbf"]) or math.inf) for f in scenario.faults if "mtbf" in f.at]
    return 1.0 / sum(rates) if rates and sum(rates) > 0 else None


@dataclass(frozen=True)
class Point:
    """One value of the sweep and what its run measured."""

    value: Any
    verdict: str
    goodput: float
    failures: int
    steps_lost: int
    checkpoint_costs: tuple[float, ...]
    step_s: float
    virtual_time_s: float
    wall_s: float
    #: the command that runs this point again (its file, its changes, its seed)
    replay: str = ""

    def row(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {**self.__dict__, "checkpoint_costs": list(self.checkpoint_costs)}


def measure(value: Any, out_dir: Path, report: dict[str, Any]) -> Point:
    """A point from a run's report and journal."""
    events = read_journal(out_dir / "journal.jsonl")
    commits = [e for e in events if e.get("event") == "checkpoint_committed" and e.get("phase") == "main"]
    # what a checkpoint held training up: its write (sync) or its snapshot (async)
    costs = tuple(float(e["t_resume"]) - float(e["t"]) + float(e["write_s"]) for e in commits)
    g = report.get("goodput") or {}
    kept = int(g.get("steps_kept") or 0)
    return Point(
        value=value,
        verdict=str(report["verdict"]),
        goodput=float(g.get("goodput") or 0.0),
        failures=sum(1 for e in events if e.get("event") == "failure_detected" and e.get("phase") == "main"),
        steps_lost=int(g.get("steps_lost") or 0),
        checkpoint_costs=costs,
        step_s=float(g.get("useful_s") or 0.0) / kept if kept else 0.0,
        # a run cut short has no phase end: the last virtual time it reached, as its report's goodput
        virtual_time_s=float(report.get("virtual_time_s") or g.get("total_s") or 0.0),
        wall_s=float(report.get("wall_s") or 0.0),
        replay=str(report.get("replay") or ""),
    )


def young_daly(points: list[Point], mtbf: float) -> dict[str, float]:
    """The optimum interval from the measured checkpoint cost and step time, in seconds and steps."""
    costs = [c for p in points for c in p.checkpoint_costs]
    steps = [p.step_s for p in points if p.step_s > 0]
    if not costs or not steps:
        raise ScenarioError(
            "no checkpoint was committed or no step kept in the sweep: nothing to set beside Young/Daly"
        )
    cost, step_s = sum(costs) / len(costs), sum(steps) / len(steps)
    tau = math.sqrt(2.0 * cost * mtbf)
    return {
        "checkpoint_cost_s": cost,
        "mtbf_s": mtbf,
        "step_s": step_s,
        "young_s": tau,
        "young_steps": tau / step_s,
        "daly_steps": max(tau - cost, 0.0) / step_s,
    }


def fitted_optimum(points: list[Point]) -> float | None:
    """The interval (in steps) that maximises ``a - b / k - c k`` fitted to the measured goodputs of
    the points whose runs passed, by least squares (through them, with three; more average their
    noise); None with fewer than three distinct intervals or a fit with no maximum (b or c not
    positive). The maximum may lie outside the intervals swept."""
    kept = [p for p in points if p.verdict == "pass"]
    if len({float(p.value) for p in kept}) < 3:
        return None
    rows = [[1.0, -1.0 / float(p.value), -float(p.value)] for p in kept]
    (_, b, c), *_ = np.linalg.lstsq(np.array(rows), np.array([p.goodput for p in kept]), rcond=None)
    return float(math.sqrt(b / c)) if b > 0 and c > 0 else None


def table(points: list[Point], field: str) -> str:
    """A Markdown table of the points."""
    head = (
        "verdict",
        "goodput",
        "failures",
        "step runs lost",
        "checkpoint cost s",
        "virtual time s",
        "wall s",
    )
    lines = ["| " + " | ".join((field, *head)) + " |", "|---" * 8 + "|"]
    for p in points:
        cost = sum(p.checkpoint_costs) / len(p.checkpoint_costs) if p.checkpoint_costs else 0.0
        lines.append(
            f"| {p.value} | {p.verdict} | {p.goodput:.2%} | {p.failures} | {p.steps_lost} | {cost:.4g} "
            f"| {p.virtual_time_s:.6g} | {p.wall_s:.1f} |"
        )
    return "\n".join(lines)


def sweep(
    path: Path,
    field: str,
    values: list[Any],
    out_dir: Path,
    mtbf: float | None = None,
    seed: int | None = None,
    address: str | None = None,
) -> dict[str, Any]:
    """Run the scenario at ``path`` once per value of ``field``; write and return the summary."""
    text = path.read_text()
    parse_scenario(text, str(path))  # the base file's own problems, with its own line numbers
    scenarios = [with_field(text, str(path), field, v, mtbf) for v in values]
    if seed is not None:
        scenarios = [s.with_seed(seed) for s in scenarios]
    points: list[Point] = []
    with RaySession(address), shared_references():  # the points share their reference run
        for value, scenario in zip(values, scenarios):
            where = out_dir / f"{field.rsplit('.', 1)[-1]}={value}"
            result = run(scenario, where, address=address)
            points.append(measure(value, where, result.data))
    best = max(points, key=lambda p: p.goodput)
    summary: dict[str, Any] = {"field": field, "points": [p.row() for p in points], "best": best.value}
    m = job_mtbf(scenarios[0])
    if field == INTERVAL and m is not None:
        yd = young_daly(points, m)
        summary["young_daly"] = yd
        summary["best_over_optimum"] = float(best.value) / yd["young_steps"]
        fitted = fitted_optimum(points)
        if fitted is not None:
            summary["fitted_steps"] = fitted
            summary["fitted_over_optimum"] = fitted / yd["young_steps"]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "sweep.json").write_text(json.dumps(summary, indent=1))
    text_table = table(points, field)
    (out_dir / "sweep.md").write_text(text_table + "\n")
    optimum = summary["young_daly"]["young_steps"] if "young_daly" in summary else None
    title = f"{scenarios[0].name}: goodput against {field}" + (f", MTBF {m:.4g} s" if m else "")
    if all(isinstance(p.value, (int, float)) and not isinstance(p.value, bool) for p in points):
        sweep_figure(
            [(float(p.value), p.goodput) for p in points],
            optimum,
            out_dir / "sweep.png",
            field,
            title,
            summary.get("fitted_steps"),
        )
    summary["table"] = text_table
    return summary
