"""Strategy comparison: one scenario, its seeded faults unchanged, run under each recovery strategy.

``testbed compare SCENARIO --strategies restart,hot_spare`` runs the scenario
once per strategy (only ``policy.recovery.strategy`` differs, so the fault
plan and every seeded draw are the same) on one Ray instance, and writes a
table of verdict, recovery time (virtual seconds, with its breakdown; an
elastic job's rejoin counts too), lost step runs, goodput and wall time, as
``compare.md`` and ``compare.json``, and the figure ``compare.png``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from testbed.actors.session import RaySession
from testbed.control.runner import run
from testbed.control.shared_reference import shared_references
from testbed.core.registry import STRATEGIES
from testbed.report.plots import strategy_figure
from testbed.scenario.model import Scenario
from testbed.scenario.overrides import with_overrides


def with_strategy(scenario: Scenario, strategy: str) -> Scenario:
    """The same scenario under another recovery strategy (a change its replay line carries)."""
    if scenario.file and Path(scenario.file).is_file():
        return with_overrides(scenario, [f"policy.recovery.strategy={strategy}"])
    recovery = dataclasses.replace(scenario.policy.recovery, strategy=strategy)
    return dataclasses.replace(scenario, policy=dataclasses.replace(scenario.policy, recovery=recovery))


def row(strategy: str, report: dict[str, Any]) -> dict[str, Any]:
    """One line of the table, from a run's report."""
    recs = report.get("recoveries") or []
    g = report.get("goodput") or {}
    parts: dict[str, float] = {}
    for r in recs:
        for k, v in r["breakdown"].items():
            parts[k] = parts.get(k, 0.0) + float(v)
    rejoin_s = sum(float(j["relink_s"]) + float(j["load_s"]) for j in report.get("rejoins") or [])
    if report.get("rejoins"):  # an elastic job's replica coming back: re-link and copy from a peer
        parts["rejoin_s"] = rejoin_s
    return {
        "strategy": strategy,
        "verdict": report["verdict"],
        "recoveries": [r["strategy"] for r in recs],
        "recovery_s": sum(float(r["total_s"]) for r in recs) + rejoin_s,
        "breakdown": parts,
        "steps_lost": g.get("steps_lost"),
        "goodput": g.get("goodput"),
        "virtual_time_s": report.get("virtual_time_s") or g.get("total_s"),  # a run cut short: how far
        "wall_s": report.get("wall_s"),
        "replay": report.get("replay"),
    }


def table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of the rows."""
    head = ("strategy", "verdict", "recovery (virtual s)", "breakdown", "step runs lost", "goodput")
    lines = ["| " + " | ".join((*head, "virtual time s", "wall s")) + " |", "|---" * 8 + "|"]
    for r in rows:
        parts = ", ".join(f"{k[:-2]} {v:.4g}" for k, v in r["breakdown"].items())
        good = "-" if r["goodput"] is None else f"{r['goodput']:.2%}"
        virtual = "-" if r["virtual_time_s"] is None else f"{r['virtual_time_s']:.4g}"  # a run cut short
        wall = "-" if r["wall_s"] is None else f"{r['wall_s']:.1f}"
        lines.append(
            f"| {r['strategy']} | {r['verdict']} | {r['recovery_s']:.4g} | {parts or '-'} "
            f"| {r['steps_lost']} | {good} | {virtual} | {wall} |"
        )
    return "\n".join(lines)


def compare(
    scenario: Scenario, strategies: list[str], out_dir: Path, address: str | None = None
) -> list[dict[str, Any]]:
    """Run ``scenario`` under each strategy (under ``out_dir/STRATEGY``); write and return the rows."""
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        from testbed.core.errors import ScenarioError

        msg = f"unknown strategy {', '.join(unknown)}; use some of {', '.join(sorted(STRATEGIES))}"
        raise ScenarioError(msg)
    rows = []
    with RaySession(address), shared_references():  # the strategies share their reference run
        for strategy in strategies:
            result = run(with_strategy(scenario, strategy), out_dir / strategy, address=address)
            rows.append(row(strategy, result.data))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "compare.json").write_text(json.dumps(rows, indent=1))
    (out_dir / "compare.md").write_text(table(rows) + "\n")
    strategy_figure(rows, out_dir / "compare.png", f"{scenario.name} (seed {scenario.seed})")
    return rows
