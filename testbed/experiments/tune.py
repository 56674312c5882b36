"""Timeout tuning: the seeds' pressure test as a command.

``testbed tune SCENARIO`` runs the scenario (its load and its faults: slow
link setup at the modelled scale, checkpoint pauses, stragglers, and the
real faults whose detection it times) once per candidate connect timeout,
then once per candidate exec timeout with the connect timeout it found, and
counts for each:

- false timeouts: a link setup given up on although the link would have come
  up (``LinkSetupTimeout``), a collective given up on although its message
  was on its way (``CollectiveTimeout`` with ``true_timeout: false``);
- real failures (a kill, a hang, a dropped link, a torn write) detected,
  missed (the job ended first), and how long after they happened the
  slowest was detected (virtual seconds).

It recommends the smallest connect timeout with no false setup timeout, and
the smallest exec timeout with no false timeout that also keeps the ladder
(above connect + 20 s), with a process-group timeout a quarter above it;
prints them as settings to paste, writes ``tune.md``, ``tune.json``,
``tune.png`` (false timeouts against detection latency) and ``tuned.yaml``,
the scenario with the recommended values, to re-run.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import yaml

from faults.kind import kinds
from testbed.actors.session import RaySession
from testbed.control.runner import run
from testbed.core.journal import read_journal
from testbed.scenario.model import Scenario
from testbed.scenario.timeout_ladder import CONNECT_GRACE_S

CONNECT = (120.0, 300.0, 600.0, 1200.0, 2400.0)
EXEC = (60.0, 120.0, 300.0, 600.0, 1200.0, 1836.0, 3600.0)
#: The recommended process-group timeout is this much above the exec timeout (the ladder's margin).
PG_MARGIN = 1.25


def with_timeouts(scenario: Scenario, connect_s: float, exec_s: float) -> Scenario:
    """The same scenario with other connect and exec timeouts."""
    t = dataclasses.replace(scenario.policy.timeouts, connect_s=connect_s, exec_s=exec_s)
    return dataclasses.replace(scenario, policy=dataclasses.replace(scenario.policy, timeouts=t))


def _errors(e: dict[str, Any]) -> list[dict[str, Any]]:
    """The errors of a failure event as (``error`` type, ``true_timeout``, ``op``, ``step``) records."""
    if e.get("event") == "job_failed":
        return [{**e, "error": e.get("error_type")}]
    return [{**x, "step": e.get("step")} for x in e.get("errors", {}).values()]


def measure(events: list[dict[str, Any]]) -> dict[str, Any]:
    """False timeouts (and where the first one fired) and real detections (with their latency) of a
    run's main phase, including a failure that ended the job."""
    false_setup = false_exec = 0
    first_false: str | None = None
    latencies: list[float] = []
    planned: list[dict[str, Any]] = next((e["faults"] for e in events if e.get("event") == "plan"), [])
    registry = kinds()
    real = sum(1 for f in planned if f.get("kind") in registry and registry[f["kind"]].real_failure)
    for e in events:
        failed = e.get("event") == "job_failed"
        if not failed and not (e.get("event") == "failure_detected" and e.get("phase") == "main"):
            continue
        errors = _errors(e)
        falsely = [x for x in errors if x["error"] == "CollectiveTimeout" and x.get("true_timeout") is False]
        if any(x["error"] == "LinkSetupTimeout" for x in errors):
            false_setup += 1
            first_false = first_false or f"link setup, step {e.get('step', 0)}"
        elif falsely:
            false_exec += 1
            first_false = first_false or f"{falsely[0].get('op') or 'collective'}, step {falsely[0]['step']}"
        elif not failed:
            latencies.append(float(e["t"]) - float(e["t_death"]))
    return {
        "false_setup": false_setup,
        "false_exec": false_exec,
        "first_false": first_false,
        "detected": len(latencies),
        "missed": max(0, real - len(latencies)),
        "latency_s": max(latencies) if latencies else None,
    }


def _row(value: float, result: Any) -> dict[str, Any]:
    found = measure(read_journal(result.out_dir / "journal.jsonl"))
    return {"value": value, "verdict": result.verdict, **found}


def recommend(connect_rows: list[dict[str, Any]], exec_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The smallest safe connect timeout, and the smallest safe exec timeout above it on the ladder."""
    ok_connect = [r["value"] for r in connect_rows if r["false_setup"] == 0]
    connect = min(ok_connect) if ok_connect else None
    floor = (connect or max(r["value"] for r in connect_rows)) + CONNECT_GRACE_S
    ok_exec = [r["value"] for r in exec_rows if r["false_exec"] == 0 and r["false_setup"] == 0]
    laddered = [v for v in ok_exec if v > floor]
    exec_s = min(laddered) if laddered else None
    out: dict[str, Any] = {"connect_s": connect, "exec_s": exec_s}
    if connect is None:
        out["why"] = (
            f"every connect candidate up to {max(r['value'] for r in connect_rows):g} s timed out falsely"
        )
    elif exec_s is None:
        out["why"] = f"no exec candidate above {floor:g} s ran without a false timeout"
    else:
        out["pg_timeout_s"] = float(math.ceil(exec_s * PG_MARGIN))
        out["env"] = [
            f"export HCCL_CONNECT_TIMEOUT={connect:g}",
            f"export HCCL_EXEC_TIMEOUT={exec_s:g}",
            "# torch: dist.init_process_group(..., "
            f"timeout=datetime.timedelta(seconds={out['pg_timeout_s']:g}))",
        ]
    return out


def table(rows: list[dict[str, Any]], name: str) -> str:
    """A Markdown table of one sweep."""
    head = (name, "verdict", "false setup timeouts", "false exec timeouts", "first false timeout")
    tail = ("real failures detected", "missed", "slowest detection s")
    lines = ["| " + " | ".join((*head, *tail)) + " |", "|---" * 8 + "|"]
    for r in rows:
        lat = "-" if r["latency_s"] is None else f"{r['latency_s']:.4g}"
        where = r["first_false"] or "-"
        cells = (f"{r['value']:g}", r["verdict"], r["false_setup"], r["false_exec"], where)
        more = (r["detected"], r["missed"], lat)
        lines.append("| " + " | ".join(str(c) for c in (*cells, *more)) + " |")
    return "\n".join(lines)


def tune(
    scenario: Scenario,
    out_dir: Path,
    connect: tuple[float, ...] = CONNECT,
    exec_: tuple[float, ...] = EXEC,
    address: str | None = None,
) -> dict[str, Any]:
    """Sweep connect, then exec; write the tables, the figure and the tuned scenario; return it all."""
    loose = max(exec_)
    connect_rows, exec_rows = [], []
    with RaySession(address):
        for c in connect:
            result = run(
                with_timeouts(scenario, connect_s=c, exec_s=loose), out_dir / f"connect={c:g}", address
            )
            connect_rows.append(_row(c, result))
        ok = [r["value"] for r in connect_rows if r["false_setup"] == 0]
        chosen = min(ok) if ok else max(connect)
        for e in exec_:
            result = run(
                with_timeouts(scenario, connect_s=chosen, exec_s=e), out_dir / f"exec={e:g}", address
            )
            exec_rows.append(_row(e, result))
    advice = recommend(connect_rows, exec_rows)
    summary = {"connect": connect_rows, "exec": exec_rows, "recommended": advice}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tune.json").write_text(json.dumps(summary, indent=1))
    text = table(connect_rows, "connect_s") + "\n\n" + table(exec_rows, "exec_s")
    (out_dir / "tune.md").write_text(text + "\n")
    summary["table"] = text
    from testbed.report.plots import tune_figure

    tune_figure(exec_rows, advice.get("exec_s"), out_dir / "tune.png", scenario.name)
    if advice.get("exec_s") is not None and scenario.file and Path(scenario.file).is_file():
        summary["tuned"] = str(write_tuned(Path(scenario.file), advice, out_dir / "tuned.yaml"))
    return summary


def write_tuned(source: Path, advice: dict[str, Any], path: Path) -> Path:
    """The scenario file with the recommended timeouts (comments are not kept)."""
    raw = yaml.safe_load(source.read_text())
    timeouts = raw.setdefault("policy", {}).setdefault("timeouts", {})
    timeouts.update(
        connect_s=advice["connect_s"], exec_s=advice["exec_s"], pg_timeout_s=advice["pg_timeout_s"]
    )
    raw["name"] = f"{raw.get('name', 'scenario')}-tuned"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path
