"""Commands that run scenarios and read their results: ``run``, ``resume``, ``suite``, ``drill``,
``report``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from testbed.cli.arguments import RAY_LOG, add_set, fits_here, load, out_dir, writable_folder
from testbed.core.errors import ScenarioError


def add(commands: Any) -> None:
    """Add this module's commands to the ``testbed`` subparsers."""
    r = commands.add_parser("run", help="run a scenario and check it")
    r.add_argument("scenario", help="scenario YAML file")
    r.add_argument("--seed", type=int, help="override the scenario's seed")
    add_set(r)
    r.add_argument("--out", help="run directory (default runs/NAME-seedN-TIME)")
    r.add_argument(
        "--address", help="an existing Ray cluster to use (default: start a private one on 127.0.0.1)"
    )
    r.add_argument(
        "--storage",
        help="checkpoint storage: a folder every Ray node shares, checked at start (default: the run "
        "directory; on a multi-node cluster that too must be shared)",
    )
    r.set_defaults(handler=run)
    rs = commands.add_parser(
        "resume", help="go on with a run whose controller died, from its journal and its checkpoints"
    )
    rs.add_argument("run_dir", help="the run's directory (holding journal.jsonl and scenario.yaml)")
    rs.add_argument(
        "--scenario",
        help="the scenario file the run started with (default: its copy in the run directory); the "
        "run's --set changes and seed are applied to it as the run journalled them",
    )
    rs.add_argument("--address", help="an existing Ray cluster to use (default: a private one on 127.0.0.1)")
    rs.add_argument("--storage", help="the checkpoint storage the run used (default: as it journalled)")
    rs.set_defaults(handler=resume)
    rp = commands.add_parser(
        "report", help="re-render a run's summary, junit.xml and timeline.png from its files"
    )
    rp.add_argument("run_dir", help="a run directory (holding report.json and journal.jsonl)")
    rp.add_argument("--html", action="store_true", help="rebuild only report.html, the run's page")
    rp.set_defaults(handler=report)
    d = commands.add_parser("drill", help="run seeded fault schedules against a scenario; shrink a failure")
    d.add_argument(
        "scenario", nargs="?", default="scenarios/drill.yaml", help="base scenario (default drill.yaml)"
    )
    d.add_argument("--seed", type=int, default=0, help="the drill's seed (default 0)")
    d.add_argument(
        "--budget", default="5m", help="time to spend drawing schedules, e.g. 90s, 5m (default 5m)"
    )
    d.add_argument(
        "--schedules",
        type=int,
        help="stop after this many schedules, if the budget lasts: the same ones on any machine (default: "
        "as many as the budget allows)",
    )
    d.add_argument("--max-faults", type=int, default=3, help="most faults in a schedule (default 3)")
    d.add_argument("--check-determinism", action="store_true", help="run each schedule twice and compare")
    d.add_argument("--kinds", help="fault kinds to draw, comma-separated (default: every drill kind)")
    d.add_argument("--out", help="directory (default runs/drill-NAME-seedN-TIME)")
    d.set_defaults(handler=drill)
    u = commands.add_parser(
        "suite", help="run scenarios as a regression suite: each must come to the verdict it declares"
    )
    u.add_argument("paths", nargs="+", metavar="path", help="scenario files, or folders of them")
    u.add_argument("--tag", action="append", default=[], help="only scenarios with this tag (repeat, or a,b)")
    u.add_argument("--junit", help="the JUnit XML file to write (default OUT/junit.xml)")
    u.add_argument("--out", help="directory (default runs/suite-TIME)")
    u.add_argument("--html", metavar="DIR", help="also write DIR/index.html, linking to each run's page")
    u.add_argument("--address", help="an existing Ray cluster to use (default: a private one on 127.0.0.1)")
    u.set_defaults(handler=suite)


def run(args: argparse.Namespace) -> int:
    """``testbed run``: run one scenario, print its summary."""
    from testbed.actors.terminal import ray_output_to
    from testbed.audit.scenario import is_audit
    from testbed.control.runner import prepare_out_dir
    from testbed.control.runner import run as run_scenario
    from testbed.report.progress import Progress
    from testbed.report.summary import render

    if is_audit(args.scenario):
        return _run_audit(args)
    scenario = load(args.scenario, args.seed, args.sets)
    fits_here(scenario, args.address)
    out = out_dir(args.out, f"{scenario.name}-seed{scenario.seed}")
    prepare_out_dir(out)
    print(f"testbed: running {scenario.name} with seed {scenario.seed}; output in {out}", flush=True)
    with ray_output_to(out / RAY_LOG) as terminal:
        progress = Progress.for_terminal(terminal.err, scenario.workload.steps)
        result = run_scenario(scenario, out, address=args.address, listener=progress, storage=args.storage)
    print(render(result.data), flush=True)
    return result.exit_code


def resume(args: argparse.Namespace) -> int:
    """``testbed resume``: check the folder is a resumable run (else exit 254, nothing changed), go on
    with it to its end, print its summary."""
    from testbed.actors.terminal import ray_output_to
    from testbed.control.resume import interrupted
    from testbed.control.resume import resume as resume_run
    from testbed.report.progress import Progress
    from testbed.report.summary import render

    run_dir = Path(args.run_dir)
    found = interrupted(run_dir, scenario_file=args.scenario)
    print(f"testbed: resuming {found.scenario.name} (seed {found.scenario.seed}) in {run_dir}", flush=True)
    with ray_output_to(run_dir / RAY_LOG) as terminal:
        progress = Progress.for_terminal(terminal.err, found.scenario.workload.steps)
        result = resume_run(run_dir, found.scenario, args.address, progress, args.storage)
    print(render(result.data), flush=True)
    return result.exit_code


def _run_audit(args: argparse.Namespace) -> int:
    """``testbed run`` of an audit scenario (workload ``program``): the resume audit it declares."""
    from dataclasses import replace

    from testbed.audit.scenario import load_audit, run_audit

    scenario = load_audit(args.scenario)
    if args.sets or args.address or args.storage:
        raise ScenarioError(
            f"{args.scenario}: an audit scenario runs on this machine as it is written; drop --set, "
            "--address and --storage (testbed audit-resume takes its fields as options)"
        )
    if args.seed is not None:
        scenario = replace(scenario, plan=replace(scenario.plan, seeds=(args.seed,)), seed=args.seed)
    out = out_dir(args.out, f"{scenario.name}-seed{scenario.seed}")
    print(f"testbed: running the resume audit {scenario.name}; output in {out}", flush=True)
    run = run_audit(scenario, out)
    print((out / "summary.txt").read_text(), end="", flush=True)
    return run.exit_code


def report(args: argparse.Namespace) -> int:
    """``testbed report``: re-render a run's outputs from its report.json and journal."""
    import json

    from testbed.control.runner import write_outputs
    from testbed.core.journal import read_journal
    from testbed.report.fault_rows import fault_rows
    from testbed.report.summary import render

    run_dir = Path(args.run_dir)
    report_file, journal = run_dir / "report.json", run_dir / "journal.jsonl"
    if not report_file.is_file() or not journal.is_file():
        raise ScenarioError(f"{run_dir}: no report.json and journal.jsonl there; give the directory of a run")
    summary = json.loads(report_file.read_text())
    events = read_journal(journal)
    summary["fault_table"] = fault_rows(events)  # from the journal, as the run itself built it
    if args.html:
        from testbed.report.html_report import write_html

        print(f"wrote {write_html(summary, events, run_dir / 'report.html')}")
        return int(summary.get("exit_code", 0))
    write_outputs(summary, events, run_dir)
    print(render(summary))
    print(f"wrote {run_dir / 'report.html'}, {run_dir / 'junit.xml'} and {run_dir / 'timeline.png'}")
    return int(summary.get("exit_code", 0))


def drill(args: argparse.Namespace) -> int:
    """``testbed drill``: seeded fault schedules against a scenario until the budget is spent."""
    from testbed.actors.terminal import ray_output_to
    from testbed.core.units import parse_duration
    from testbed.testing.drill import render, run_drill
    from testbed.testing.schedules import SCHEDULE_KINDS

    scenario = load(args.scenario, None)
    budget = parse_duration(args.budget)
    if budget is None or budget <= 0:
        raise ScenarioError(f"--budget {args.budget!r} is not a positive duration; write 90s, 5m or 300")
    if args.seed < 0 or not 1 <= args.max_faults <= 10:
        raise ScenarioError("--seed is a non-negative integer and --max-faults is 1..10")
    if args.schedules is not None and args.schedules < 1:
        raise ScenarioError(
            f"--schedules {args.schedules}: give 1 or more, or leave it out for the budget alone"
        )
    out = out_dir(args.out, f"drill-{scenario.name}-seed{args.seed}")
    print(
        f"testbed: drilling {scenario.name} with seed {args.seed} for {budget:g} s"
        + (f" or {args.schedules} schedule(s)" if args.schedules else "")
        + f"; output in {out}",
        flush=True,
    )
    kinds = SCHEDULE_KINDS
    if args.kinds:
        kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
        unknown = sorted(set(kinds) - set(SCHEDULE_KINDS))
        if unknown or not kinds:
            raise ScenarioError(f"--kinds {args.kinds!r}: a drill draws from {', '.join(SCHEDULE_KINDS)}")
    fits_here(scenario, None)
    with ray_output_to(out / RAY_LOG):
        result = run_drill(
            scenario, args.seed, budget, out, args.max_faults, args.check_determinism, kinds, args.schedules
        )
    print(render(result), flush=True)
    return result.exit_code


def suite(args: argparse.Namespace) -> int:
    """``testbed suite``: each scenario must come to the verdict it declares."""
    from testbed.actors.terminal import ray_output_to
    from testbed.audit.scenario import AuditScenario
    from testbed.testing import suite as suites

    scenarios = suites.load_suite(suites.scenario_files(args.paths))
    tags = [t.strip() for raw in args.tag for t in raw.split(",") if t.strip()]
    chosen = suites.with_tags(scenarios, tags)
    out = out_dir(args.out, "suite")
    if args.junit:
        if Path(args.junit).is_dir():
            raise ScenarioError(f"--junit {args.junit}: that is a folder; give the path of the XML file")
        writable_folder(Path(args.junit).parent, "--junit")
    if args.html:
        writable_folder(Path(args.html), "--html")
    for scenario in chosen if args.address is None else []:
        if not isinstance(scenario, AuditScenario):
            fits_here(scenario, None)
    print(
        f"testbed: suite of {len(chosen)} scenario(s)"
        + (f" tagged {', '.join(tags)}" if tags else "")
        + f"; output in {out}",
        flush=True,
    )
    with ray_output_to(out / RAY_LOG) as terminal:

        def show(row: suites.SuiteRow) -> None:
            mark = "ok" if row.as_declared else "NOT AS DECLARED"
            terminal.out.write(f"  {mark:15} {row.scenario:28} {row.got} ({row.wall_s:.1f} s)\n")

        rows = suites.run_suite(chosen, out, args.address, on_row=show)
    junit = suites.write(rows, out, Path(args.junit) if args.junit else None)
    print(suites.table(rows))
    print(f"wrote {out / 'suite.json'} and {junit}")
    if args.html:
        from dataclasses import asdict

        from testbed.report.html_suite import write_suite_page

        print(f"wrote {write_suite_page([asdict(r) for r in rows], Path(args.html))} (open it in a browser)")
    return suites.exit_code(rows)
