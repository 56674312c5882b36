"""How a run ends: whatever happened in it, the journal is closed, checked and reported.

:func:`conclude` runs the body of a run (driving the cluster) and turns what
came of it into the verdict and exit code: a failure of the modelled job is
journalled for the checks to judge; Ctrl-C, a scenario the cluster cannot
run, an aborted or a crashed run each end with their exit code and error.
Either way the journal gets its fault effects and its ``run_end``, and the
run folder its ``report.json``, ``junit.xml`` and plots.
"""

from __future__ import annotations

import json
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from faults.effects import fault_effects
from testbed.control.ending import Ending
from testbed.core.errors import (
    CollectiveTimeout,
    DeviceFault,
    HarnessHang,
    HeadLost,
    LinkSetupError,
    LinkSetupTimeout,
    PeerLost,
    RecoveryFailed,
    SafeguardTripped,
    ScenarioError,
    UnsupportedOperator,
)
from testbed.core.interrupts import interruptible
from testbed.core.journal import Journal, last_time, read_journal
from testbed.report.against_estimate import against_estimate
from testbed.report.checks import CheckResult, declared, run_checks, verdict
from testbed.report.fault_rows import fault_rows
from testbed.report.goodput import goodput
from testbed.report.hotspot import diagnose
from testbed.report.netem_counts import netem_counts
from testbed.report.run_report import Report
from testbed.report.serving_report import serving_report
from testbed.scenario.model import Scenario
from testbed.scenario.overrides import replay_command

EXIT_PASS, EXIT_FAIL, EXIT_UNKNOWN, EXIT_ABORTED = 0, 1, 2, 3
EXIT_INTERRUPTED, EXIT_INVALID, EXIT_CRASH = 130, 254, 255

#: Failures of the modelled job (not of the testbed) that no recovery handled.
MODELLED_FAILURES = (
    LinkSetupTimeout,
    LinkSetupError,
    CollectiveTimeout,
    PeerLost,
    UnsupportedOperator,
    DeviceFault,
)


#: the outcome of a run whose Ray head was lost: it can be resumed on another Ray
HEAD_LOST = "head_lost"


def head_lost(journal: Journal, out_dir: Path, exc: HeadLost) -> str:
    """Journal the loss of Ray's head (``ray_head_lost``, at the journal's last virtual time) and say
    what it left: the newest committed checkpoint, and the command that goes on from it."""
    events = journal.events
    steps = [int(e["step"]) for e in events if e.get("event") == "step_end" and e.get("phase") == "main"]
    committed = [int(e["step"]) for e in events if e.get("event") == "checkpoint_committed"]
    journal.emit(
        "ray_head_lost",
        phase="main",
        t=last_time(events),
        last_step=max(steps, default=None),
        address=exc.fields.get("address"),
    )
    kept = f"its newest checkpoint (step {max(committed)}) is untouched" if committed else "no checkpoint"
    return (
        f"{exc}. The run stopped after step {max(steps, default=0)}; {kept}. Once a Ray head "
        f"is back, go on with: testbed resume {out_dir} --address <the new head>"
    )


def conclude(
    scenario: Scenario,
    journal: Journal,
    out_dir: Path,
    wall0: float,
    body: Callable[[], Callable[[], None] | None],
) -> Report:
    """Run ``body`` (the run's driving, after its first events), then close the journal, check it
    and write the report: the run's :class:`Report`, whatever ``body`` came to. What ``body``
    returns, the run's ending (its processes' stop), runs meanwhile (:class:`Ending`)."""
    outcome, code, error, end = "", EXIT_PASS, None, None
    try:
        with interruptible():
            end = body()
    except MODELLED_FAILURES as exc:  # the modelled job failed for good: the checks judge it
        journal.emit(
            "job_failed",
            error_type=type(exc).__name__,
            error=str(exc),
            **{k: v for k, v in exc.fields.items() if isinstance(v, (int, float, str, list))},
        )
    except KeyboardInterrupt:
        outcome, code, error = "interrupted", EXIT_INTERRUPTED, "interrupted by the user (Ctrl-C)"
    except ScenarioError as exc:  # valid on paper, not on this Ray cluster
        outcome, code, error = "invalid", EXIT_INVALID, str(exc)
    except HeadLost as exc:
        outcome, code, error = HEAD_LOST, EXIT_ABORTED, head_lost(journal, out_dir, exc)
    except (HarnessHang, RecoveryFailed, SafeguardTripped) as exc:
        outcome, code, error = "aborted", EXIT_ABORTED, f"{type(exc).__name__}: {exc}"
    except Exception as exc:
        outcome, code, error = "crash", EXIT_CRASH, f"{type(exc).__name__}: {exc}"
        journal.emit("traceback", text=traceback.format_exc())
    if error:
        journal.emit("run_error", outcome=outcome, error=error)
    with Ending(end):
        return _report(scenario, journal, out_dir, wall0, (outcome, code, error))


def _report(
    scenario: Scenario, journal: Journal, out_dir: Path, wall0: float, came: tuple[str, int, str | None]
) -> Report:
    """Close the journal, check it, and write the report and its companions."""
    outcome, code, error = came
    effects = fault_effects(journal.events)
    if effects:
        journal.emit("fault_effects", effects={k: e.as_dict() for k, e in effects.items()})
    journal.emit("run_end", seed=scenario.seed, wall_total_s=round(time.monotonic() - wall0, 3))
    journal.close()
    events = read_journal(out_dir / "journal.jsonl")
    results = run_checks(events, scenario.expect)
    if not outcome:
        outcome, code = verdict(results)
    report = build_report(scenario, events, results, outcome, code, error, out_dir)
    (out_dir / "report.json").write_text(json.dumps(report, indent=1, sort_keys=True, default=str))
    write_outputs(report, events, out_dir)
    return Report(outcome, code, out_dir, report)


def write_outputs(report: dict[str, Any], events: list[dict[str, Any]], out_dir: Path) -> None:
    """Beside the report: ``report.html`` (the run as a page), ``junit.xml`` (a test case per check),
    ``timeline.png`` and, for a serving run, ``serving.png``."""
    from testbed.report.html_report import write_html
    from testbed.report.junit import write_junit
    from testbed.report.serving_plot import serving_figure
    from testbed.report.timeline_plot import timeline_figure

    write_html(report, events, out_dir / "report.html")
    write_junit(report, out_dir / "junit.xml")
    title = f"{report['scenario']} (seed {report['seed']}): {report['verdict']}"
    timeline_figure(events, out_dir / "timeline.png", title)
    serving_figure(events, out_dir / "serving.png", title)


def step_time(steps: list[dict[str, Any]]) -> dict[str, float] | None:
    """Median over steps of the slowest rank's compute, comm wait and bubble; FLOPs of a step in all.

    The median keeps the first step's link set-up out of the typical step.
    """
    if not steps or "bubble_s" not in steps[0]:
        return None
    out = {k: statistics.median(max(e[k]) for e in steps) for k in ("compute_s", "comm_wait_s", "bubble_s")}
    out["flops"] = statistics.median(sum(e["flops"]) for e in steps)
    return out


def memory_trend(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Device memory by step, in step order, each figure the maximum over the ranks and over every
    run of that step (a step recomputed after a recovery counts once)."""
    by_step: dict[int, dict[str, Any]] = {}
    for e in steps:
        if "memory" not in e:
            continue
        now = {k: max(e["memory"][k]) for k in ("fragmentation", "allocated", "reserved")}
        seen = by_step.setdefault(int(e["step"]), {"step": int(e["step"]), **now})
        for k, v in now.items():
            seen[k] = max(seen[k], v)
    return [by_step[step] for step in sorted(by_step)]


def build_report(
    scenario: Scenario,
    events: list[dict[str, Any]],
    results: list[CheckResult],
    outcome: str,
    code: int,
    error: str | None,
    out_dir: Path,
) -> dict[str, Any]:
    """The report: verdict, seed, steps, faults, recoveries and checks, from the journal."""
    main_steps = [e for e in events if e.get("event") == "step_end" and e.get("phase") == "main"]
    end = next((e for e in events if e.get("event") == "phase_end" and e.get("phase") == "main"), None)
    return {
        "scenario": scenario.name,
        "file": scenario.file,
        "seed": scenario.seed,
        "replay": replay_command(scenario),
        "verdict": outcome,
        "exit_code": code,
        "error": error,
        "steps": {
            "planned": scenario.workload.steps,
            "completed": max((e["step"] for e in main_steps), default=0),
            "run": len(main_steps),
        },
        "loss": {
            "first": main_steps[0]["loss"] if main_steps else None,
            "last": main_steps[-1]["loss"] if main_steps else None,
        },
        "virtual_time_s": end["t"] if end else None,
        "layout": scenario.workload.layout().describe(),
        "warnings": [e["message"] for e in events if e.get("event") == "warning"],
        "refused_peers": [
            {k: e.get(k) for k in ("listener", "peer", "reason")}
            for e in events
            if e.get("event") == "peer_refused"
        ],
        "step_time": step_time(main_steps),
        "goodput": goodput(events),
        "against_estimate": against_estimate(events),
        "hotspot": diagnose(events).as_dict(),
        "learned_timeouts": next(
            (
                {k: v for k, v in e.items() if k in ("setup", "step", "checkpoint")}
                for e in reversed(events)
                if e.get("event") == "timeouts_learned"
            ),
            None,
        ),
        "final_digest": end["digest"] if end else None,
        "plan_sha256": next((e.get("plan_sha256") for e in events if e.get("event") == "plan"), None),
        "faults": [e for e in events if e.get("event") == "fault_injected"],
        "fault_table": fault_rows(events),
        **({"netem": rows} if (rows := netem_counts(events)) else {}),
        "failures": [e for e in events if e.get("event") == "failure_detected"],
        "recoveries": [e for e in events if e.get("event") == "recovery_complete"],
        "rejoins": [e for e in events if e.get("event") == "elastic_rejoin"],
        "checks": [r.as_dict() for r in results],
        "declared": declared(scenario.expect, outcome, [r.as_dict() for r in results]),
        "memory_events": [
            {"step": e["step"], "rank": int(r), **ev}
            for e in main_steps
            for r, evs in e.get("memory_events", {}).items()
            for ev in evs
        ],
        "memory_trend": memory_trend(main_steps),
        "serving": serving_report(events),
        "journal": str(out_dir / "journal.jsonl"),
        "wall_s": next((e["wall_total_s"] for e in events if e.get("event") == "run_end"), None),
    }
