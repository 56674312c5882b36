"""Timeout tuning: the pressure test Ascend's guides advise (start loose, tighten under load), as a command.

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
from testbed.scenario.overrides import with_overrides
from testbed.scenario.timeout_ladder import CONNECT_GRACE_S

CONNECT = (120.0, 300.0, 600.0, 1200.0, 2400.0)
EXEC = (60.0, 120.0, 300.0, 600.0, 1200.0, 1836.0, 3600.0)
#: The recommended process-group timeout is this much above the exec timeout (the ladder's margin).
PG_MARGIN = 1.25
#: a candidate the tuner did not run (its row says why)
NOT_RUN = "not run"


def with_timeouts(scenario: Scenario, connect_s: float, exec_s: float) -> Scenario:
    """The same scenario with other connect and exec timeouts (changes its replay line carries)."""
    if scenario.file and Path(scenario.file).is_file():
        sets = [f"policy.timeouts.connect_s={connect_s:g}", f"policy.timeouts.exec_s={exec_s:g}"]
        return with_overrides(scenario, sets)
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
    detectors: dict[str, int] = {}
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
            by = str(e.get("detected_by", "?"))
            detectors[by] = detectors.get(by, 0) + 1
    setups = [
        float(e["link_setup_max_s"])
        for e in events
        if e.get("event") == "group_open" and "link_setup_max_s" in e
    ]
    waits = [
        float(w)
        for e in events
        if e.get("event") == "step_end" and e.get("phase") == "main"
        for by_op in (e.get("wait_by_op") or {}).values()
        for w in by_op.values()
    ]
    return {
        "false_setup": false_setup,
        "false_exec": false_exec,
        "first_false": first_false,
        "detected": len(latencies),
        "missed": max(0, real - len(latencies)),
        "latency_s": max(latencies) if latencies else None,
        "detected_by": detectors,
        "setup_max_s": max(setups, default=None),
        "wait_max_s": max(waits, default=None),
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
    """A Markdown table of one sweep (a candidate not run shows dashes)."""
    head = (name, "verdict", "false setup timeouts", "false exec timeouts", "first false timeout")
    tail = ("real failures detected", "detected by", "missed", "slowest detection s")
    lines = ["| " + " | ".join((*head, *tail)) + " |", "|---" * 9 + "|"]
    for r in rows:
        if r["verdict"] == NOT_RUN:
            lines.append(f"| {r['value']:g} | {NOT_RUN} |" + " - |" * 7)
            continue
        lat = "-" if r["latency_s"] is None else f"{r['latency_s']:.4g}"
        where = r["first_false"] or "-"
        by = ", ".join(f"{k} {n}" for k, n in sorted(r.get("detected_by", {}).items())) or "-"
        cells = (f"{r['value']:g}", r["verdict"], r["false_setup"], r["false_exec"], where)
        more = (r["detected"], by, r["missed"], lat)
        lines.append("| " + " | ".join(str(c) for c in (*cells, *more)) + " |")
    return "\n".join(lines)


def _values(values: list[float]) -> str:
    return ", ".join(f"{v:g}" for v in values) + " s"


def explain(
    connect_rows: list[dict[str, Any]],
    exec_rows: list[dict[str, Any]],
    advice: dict[str, Any],
    skipped: list[float],
) -> list[str]:
    """Why each candidate was chosen or rejected, the margins the choice kept, which detector found the
    real failures, and whether the exec timeout mattered at all."""
    out: list[str] = []
    connect = advice.get("connect_s")
    for r in connect_rows:
        if r["false_setup"]:
            out.append(
                f"connect {r['value']:g} s rejected: a link setup outlasted its limit of "
                f"{r['value'] + CONNECT_GRACE_S:g} s (with HCCL's {CONNECT_GRACE_S:g} s grace) and failed "
                f"falsely ({r['first_false']})"
            )
        elif r["value"] == connect:
            setup = max((x["setup_max_s"] or 0.0 for x in connect_rows + exec_rows), default=0.0)
            limit = connect + CONNECT_GRACE_S
            out.append(
                f"connect {connect:g} s chosen, the smallest without a false setup timeout: the slowest "
                f"link setup took {setup:.4g} s against its limit of {limit:g} s "
                f"({limit - setup:.4g} s to spare)"
            )
    if skipped:
        out.append(f"connect {_values(skipped)} not run: above a safe connect timeout, none can fire falsely")
    floor = (connect or max(r["value"] for r in connect_rows)) + CONNECT_GRACE_S
    below = [r["value"] for r in exec_rows if r["value"] <= floor]
    if below:
        fired = sorted({r["first_false"] for r in exec_rows if r["value"] <= floor and r["first_false"]})
        also = f" (each also timed out falsely: {'; '.join(fired)})" if fired else ""
        out.append(
            f"exec {_values(below)} rejected by the ladder: the exec timeout must exceed the link-setup "
            f"limit, connect + {CONNECT_GRACE_S:g} s = {floor:g} s, or a slow link setup reads as a hung "
            f"peer{also}"
        )
    chosen = advice.get("exec_s")
    waits = [r["wait_max_s"] for r in exec_rows if r["wait_max_s"] is not None and r["false_exec"] == 0]
    for r in exec_rows:
        if r["value"] <= floor:
            continue
        if r["false_exec"] or r["false_setup"]:
            out.append(f"exec {r['value']:g} s rejected: a false timeout ({r['first_false']})")
        elif r["value"] == chosen:
            wait = max(waits, default=0.0)
            out.append(
                f"exec {chosen:g} s chosen, the smallest on the ladder without a false timeout: the "
                f"longest healthy wait in one kind of collective in one step was {wait:.4g} s "
                f"({chosen - wait:.4g} s to spare)"
            )
    later = [r for r in exec_rows if chosen is not None and r["value"] > chosen]
    if later:
        base = next((r["latency_s"] for r in exec_rows if r["value"] == chosen), None)
        caught = [r for r in later if r["latency_s"] is not None]
        slower = [r for r in caught if base is None or r["latency_s"] > base]
        values = _values([r["value"] for r in later])
        if slower:
            slow = ", ".join(f"{r['value']:g} s: {r['latency_s']:.4g} s" for r in slower)
            out.append(f"exec {values} safe too, but slower to catch a real failure ({slow})")
        else:
            out.append(f"exec {values} safe too, and no slower here: the timeout caught nothing first")
    out.extend(_mattered(exec_rows))
    return out


def _mattered(exec_rows: list[dict[str, Any]]) -> list[str]:
    """Which detector found the real failures, and, when no exec timeout ever fired (falsely or
    truly), that the exec timeout did not matter here and what would make it matter."""
    found: dict[str, int] = {}
    for r in exec_rows:
        for by, n in (r.get("detected_by") or {}).items():
            found[by] = found.get(by, 0) + n
    timed = any(r["false_exec"] for r in exec_rows) or any(
        by in ("exec_timeout", "learned_step_timeout") for by in found
    )
    if not found:
        lines = ["no real failure was detected in any run: nothing measured how fast a timeout catches one"]
    else:
        lines = [
            "real failures were found by "
            + ", ".join(f"{by} ({n} time(s) over the runs)" for by, n in sorted(found.items()))
        ]
    if not timed:
        lines.append(
            "the exec timeout did not matter here: it never fired, falsely or truly, at any candidate, so "
            "every row detects alike. It would matter with no heartbeat (policy.detection: null), or for a "
            "failure no heartbeat sees (a dropped or flapping link, a slow peer); the recommendation is "
            "only the ladder's smallest value that nothing healthy outlasted"
        )
    return lines


def tune(
    scenario: Scenario,
    out_dir: Path,
    connect: tuple[float, ...] = CONNECT,
    exec_: tuple[float, ...] = EXEC,
    address: str | None = None,
) -> dict[str, Any]:
    """Sweep connect, then exec; write the tables, the figure and the tuned scenario; return it all."""
    loose = max(exec_)
    connect_rows: list[dict[str, Any]] = []
    exec_rows: list[dict[str, Any]] = []
    with RaySession(address):
        for c in sorted(connect):
            if any(r["false_setup"] == 0 for r in connect_rows):  # a larger one cannot fire falsely
                connect_rows.append({"value": c, "verdict": NOT_RUN})
                continue
            result = run(
                with_timeouts(scenario, connect_s=c, exec_s=loose), out_dir / f"connect={c:g}", address
            )
            connect_rows.append(_row(c, result))
        ok = [r["value"] for r in connect_rows if r.get("false_setup") == 0]
        chosen = min(ok) if ok else max(connect)
        for e in exec_:
            result = run(
                with_timeouts(scenario, connect_s=chosen, exec_s=e), out_dir / f"exec={e:g}", address
            )
            exec_rows.append(_row(e, result))
    ran = [r for r in connect_rows if r["verdict"] != NOT_RUN]
    advice = recommend(ran, exec_rows)
    why = explain(ran, exec_rows, advice, [r["value"] for r in connect_rows if r["verdict"] == NOT_RUN])
    summary = {"connect": connect_rows, "exec": exec_rows, "recommended": advice, "explanation": why}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tune.json").write_text(json.dumps(summary, indent=1))
    text = table(connect_rows, "connect_s") + "\n\n" + table(exec_rows, "exec_s")
    (out_dir / "tune.md").write_text(text + "\n\n" + "\n".join(f"- {line}" for line in why) + "\n")
    summary["table"] = text
    from testbed.report.plots import tune_figure

    tune_figure(connect_rows, exec_rows, advice, out_dir / "tune.png", scenario.name)
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
