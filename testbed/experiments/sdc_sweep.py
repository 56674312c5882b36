"""``testbed sdc-sweep SCENARIO``: fault shape x detector x interval, the table a user picks an
integrity policy from.

For a base scenario (its cluster, job, checkpoints; its own faults,
``policy.integrity`` and ``expect`` are replaced), every detector configuration
is run once clean and once per fault shape. Each shape is one transient
corruption striking the last rank at the step after the middle one (off a
round interval, so a hash's interval shows in its latency); a payload's
shape strikes the link into it from its predecessor in its replicas' ring.
The configurations are the validators alone, the hash alone at each
interval, both at each interval, the validators with replay, and the
checksums. Each cell reads its run's journal, and each row of the table
gives:

- **coverage**: the shapes detected, of those that struck (a payload's link
  may carry nothing of the reduction in some layouts: such a shape is listed
  beneath the table, not counted);
- **latency**: steps from the onset to the detection (mean and worst over
  the shapes detected);
- **overhead**: how much longer the clean run took in virtual time than the
  same run with no detector (every cost counted: the validators' and the
  hash's reads, replay's snapshot, the checksums' read of every payload);
- **false alarms**: detections in the clean run, per 1,000 steps;
- **rollback**: the steps lost by the rollbacks (mean over the shapes
  detected);
- **equal**: the shapes whose run ended equal to an uninterrupted one. A
  missed shape or a poisoned resume does not.

The configurations without a hash (the validators, the validators with
replay, the checksums) roll back to the newest checkpoint before the
detected step (``restore: newest``). With a hash, they roll back to the
newest verified one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faults.kind import kinds
from testbed.actors.session import RaySession
from testbed.control.runner import run
from testbed.core.errors import ScenarioError
from testbed.core.journal import read_journal
from testbed.experiments.sweep import as_yaml
from testbed.scenario import overrides
from testbed.scenario.model import Scenario
from testbed.scenario.parse import parse_scenario

#: the fault shapes swept, by name: each a fault entry's kind and fields
SHAPES: dict[str, dict[str, Any]] = {
    "gradient-exponent": {"kind": "sdc_gradient", "bit": 30},
    "gradient-sign": {"kind": "sdc_gradient", "bits": "sign"},
    "gradient-mantissa": {"kind": "sdc_gradient", "bits": "mantissa"},
    "gradient-bias": {"kind": "sdc_gradient", "bias": 1e-3},
    "params-exponent": {"kind": "sdc_params", "bit": 30},
    "params-sign": {"kind": "sdc_params", "bits": "sign"},
    "params-mantissa": {"kind": "sdc_params", "bits": "mantissa"},
    "params-bias": {"kind": "sdc_params", "bias": 1e-3},
    "activation-exponent": {"kind": "sdc_activation", "bit": 30},
    "activation-mantissa": {"kind": "sdc_activation", "bits": "mantissa"},
    "payload-exponent": {"kind": "sdc_payload", "bit": 30, "half": "reduce_scatter"},
    "payload-mantissa": {"kind": "sdc_payload", "bits": "mantissa", "half": "reduce_scatter"},
}
#: the detector configurations, by name: ``replay`` is the validators with Megatron's rerun (in
#: place, then as on another NPU); ``checksums`` an end-to-end checksum on every collective payload
DETECTORS = ("validators", "hash", "both", "replay", "checksums")
VALIDATORS = {"spike_factor": 10, "window": 5}


@dataclass(frozen=True)
class Config:
    """One detector configuration: its name and hash interval (None without a hash)."""

    detectors: str
    every: int | None

    @property
    def label(self) -> str:
        """How the table names it."""
        return self.detectors + (f" every {self.every}" if self.every is not None else "")

    def policy(self) -> dict[str, Any]:
        """Its ``policy.integrity`` section."""
        if self.detectors == "none":
            return {"on_detect": "report", "restore": "newest"}
        out: dict[str, Any] = {"on_detect": "rollback", "max_rollbacks": 3}
        if self.detectors in ("validators", "both", "replay"):
            out["validators"] = dict(VALIDATORS)
        if self.detectors == "replay":
            out["replay"] = {"elsewhere": True}
        if self.detectors == "checksums":
            out["checksums"] = True
        if self.every is not None:
            out["hash"] = {"every": self.every}
        out["restore"] = "verified" if self.every is not None else "newest"
        return out


def configs(detectors: list[str], intervals: list[int], dp: int) -> list[Config]:
    """The configurations swept (a hash needs two data-parallel replicas: none without them)."""
    out = []
    for name in detectors:
        if name in ("validators", "replay", "checksums"):
            out.append(Config(name, None))
        elif dp >= 2:
            out += [Config(name, every) for every in intervals]
    return out


def _scenario(
    text: str, file: str, config: Config, shape: str | None, base: Scenario, seed: int | None = None
) -> Scenario:
    """The base with this configuration and, unless clean, this shape striking the middle step (and
    ``seed``, when given)."""
    sets = [
        f"policy.integrity={as_yaml(config.policy())}",
        "expect={}",
    ]  # the sweep's figures, not the base's
    faults: list[dict[str, Any]] = []
    if shape is not None:
        rank = base.cluster.topology().world - 1
        onset = max(1, min(base.workload.steps // 2 + 1, base.workload.steps - 1))  # off a round interval
        target: dict[str, Any] = {"rank": rank}
        if not kinds()[SHAPES[shape]["kind"]].targets_ranks:  # a link's: the one into it in its ring
            replicas = base.workload.layout().group(rank, ("dp", "ep"))
            target = {"link": [replicas[replicas.index(rank) - 1], rank]}
        faults = [{**SHAPES[shape], "target": target, "at": {"step": onset}}]
    sets.append(f"faults={as_yaml(faults)}")
    scenario = overrides.apply(text, file, sets, flag="sdc-sweep")
    return scenario.with_seed(seed) if seed is not None else scenario


def measure(out_dir: Path, report: dict[str, Any]) -> dict[str, Any]:
    """One cell from its run: detected, latency, overhead, false alarms, rollback depth, equal."""
    events = read_journal(out_dir / "journal.jsonl")
    checks = {c["name"]: c for c in report["checks"]}
    detected = checks.get("sdc_detected", {}).get("evidence", {})
    rows = detected.get("corruptions", [])
    alarms = checks.get("sdc_false_alarms", {}).get("evidence", {})
    ends = {e["phase"]: e["digest"] for e in events if e.get("event") == "phase_end"}
    return {
        "verdict": report["verdict"],
        "struck": bool(rows),
        "detected": bool(rows) and all("latency" in r for r in rows),
        "latency": next((r["latency"] for r in rows if "latency" in r), None),
        "detector": next((r.get("detector") for r in rows if "latency" in r), None),
        "overhead": float(detected.get("integrity_share") or 0.0),
        "t_main": next(
            (float(e["t"]) for e in events if e.get("event") == "phase_end" and e.get("phase") == "main"), 0.0
        ),
        "false_alarms_per_1000": float(alarms.get("per_1000_steps") or 0.0),
        "rollback_steps": sum(detected.get("rollback_depth_steps") or []),
        "equal": "main" in ends and ends.get("main") == ends.get("reference", ends["main"]),
        "replay": report.get("replay", ""),
    }


def summarise(
    config: Config, clean: dict[str, Any], cells: dict[str, dict[str, Any]], t_bare: float
) -> dict[str, Any]:
    """One row of the table (``t_bare``: the virtual time of the clean run with no detector)."""
    found = [c for c in cells.values() if c["detected"]]
    lat = [int(c["latency"]) for c in found]
    return {
        "config": config.label,
        "coverage": f"{len(found)}/{sum(c['struck'] for c in cells.values())}",
        "latency_mean": sum(lat) / len(lat) if lat else None,
        "latency_max": max(lat) if lat else None,
        "overhead": clean["t_main"] / t_bare - 1.0 if t_bare > 0 else clean["overhead"],
        "false_alarms_per_1000": clean["false_alarms_per_1000"],
        "rollback_mean": sum(c["rollback_steps"] for c in found) / len(found) if found else None,
        "equal": f"{sum(c['equal'] for c in cells.values())}/{len(cells)}",
        "missed": [s for s, c in cells.items() if c["struck"] and not c["detected"]],
        # a shape that found nothing to strike (a payload on a link the reduction did not use)
        "not_struck": [s for s, c in cells.items() if not c["struck"]],
    }


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table a user picks a policy from."""
    head = ["detectors", "coverage", "latency (mean, worst)", "overhead", "false alarms /1k steps"]
    head += ["rollback steps", "ends equal", "missed"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in rows:
        lat = "-" if r["latency_mean"] is None else f"{r['latency_mean']:.2g}, {r['latency_max']}"
        back = "-" if r["rollback_mean"] is None else f"{r['rollback_mean']:.2g}"
        lines.append(
            f"| {r['config']} | {r['coverage']} | {lat} | {r['overhead'] * 100:.3g}% | "
            f"{r['false_alarms_per_1000']:.3g} | {back} | {r['equal']} | {', '.join(r['missed']) or '-'} |"
        )
    gone = sorted({s for r in rows for s in r.get("not_struck", [])})
    if gone:
        lines.append(f"\nnot struck (nothing of this job's for the shape to corrupt): {', '.join(gone)}")
    return "\n".join(lines)


def sdc_sweep(
    path: Path,
    out_dir: Path,
    shapes: list[str],
    detectors: list[str],
    intervals: list[int],
    seed: int | None = None,
) -> dict[str, Any]:
    """Sweep ``shapes`` x ``detectors`` x ``intervals`` on the scenario at ``path``; write
    ``sdc_sweep.json`` and ``sdc_sweep.md`` in ``out_dir`` and return the summary."""
    unknown = [s for s in shapes if s not in SHAPES] + [d for d in detectors if d not in DETECTORS]
    if unknown or not shapes or not detectors or any(k < 1 for k in intervals):
        raise ScenarioError(
            f"sdc-sweep: shapes from {', '.join(SHAPES)}; detectors from {', '.join(DETECTORS)}; "
            f"intervals of 1 or more (got {unknown or intervals or 'none'})"
        )
    text = path.read_text(encoding="utf-8")
    base = parse_scenario(text, str(path))
    if base.workload.name == "program" or not base.policy.checkpoint.every:
        raise ScenarioError(
            f"{path}: sdc-sweep needs a training scenario with checkpoints (policy.checkpoint.every) to "
            "roll back to"
        )
    chosen = configs(detectors, intervals, base.workload.dp)
    if not chosen:
        raise ScenarioError(f"{path}: dp={base.workload.dp} runs no hash; sweep --detectors validators")
    rows, cells_all = [], {}
    with RaySession():
        bare = Config("none", None)  # the yardstick of the overhead: the clean run with no detector
        where = out_dir / "none" / "clean"
        t_bare = measure(where, run(_scenario(text, str(path), bare, None, base, seed), where).data)["t_main"]
        for config in chosen:
            cells: dict[str, dict[str, Any]] = {}
            for shape in [None, *shapes]:
                scenario = _scenario(text, str(path), config, shape, base, seed)
                where = out_dir / config.label.replace(" ", "-") / (shape or "clean")
                cells[shape or "clean"] = measure(where, run(scenario, where).data)
            clean = cells.pop("clean")
            rows.append(summarise(config, clean, cells, t_bare))
            cells_all[config.label] = {"clean": clean, **cells}
    rendered = table(rows)
    summary: dict[str, Any] = {
        "scenario": str(path),
        "shapes": shapes,
        "rows": rows,
        "cells": cells_all,
        "table": rendered,
    }
    (out_dir / "sdc_sweep.json").write_text(json.dumps(summary, indent=1, default=str))
    (out_dir / "sdc_sweep.md").write_text(rendered + "\n")
    return summary
