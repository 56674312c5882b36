"""``testbed``: run, plan, compare, sweep, tune, drill, validate and list scenarios; re-render a run's
report; find its hotspot.

Exit codes (DESIGN section 6): 0 pass, 1 a check failed, 2 unknown, 3 aborted
by a safeguard, 130 interrupted (Ctrl-C), 254 invalid scenario or arguments,
255 testbed crash.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from testbed.core.errors import ScenarioError
from testbed.run.runner import EXIT_CRASH, EXIT_INVALID

if TYPE_CHECKING:
    from testbed.scenario.model import Scenario

#: Where, in a run's (or a suite's, a comparison's, ...) directory, what Ray printed is kept.
RAY_LOG = "ray.log"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"testbed: error: {message}; see 'testbed --help'\n")
        raise SystemExit(EXIT_INVALID)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="testbed", description="Rehearse training failures on a modelled supernode cluster.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="run a scenario and check it")
    r.add_argument("scenario", help="scenario YAML file")
    r.add_argument("--seed", type=int, help="override the scenario's seed")
    r.add_argument("--out", help="run directory (default runs/NAME-seedN-TIME)")
    r.add_argument(
        "--address", help="an existing Ray cluster to use (default: start a private one on 127.0.0.1)"
    )
    sub.add_parser("schema", help="print the JSON Schema of scenario files (for editors)")
    rp = sub.add_parser("report", help="re-render a run's summary, junit.xml and timeline.png from its files")
    rp.add_argument("run_dir", help="a run directory (holding report.json and journal.jsonl)")
    ls = sub.add_parser("list", help="the scenario library, fault kinds, presets and recovery strategies")
    ls.add_argument("--scenarios", default="scenarios", help="the scenario folder (default ./scenarios)")
    pl = sub.add_parser(
        "plan", help="resolve a scenario's faults from its seed and write plan.json; runs nothing"
    )
    pl.add_argument("scenario", help="scenario YAML file")
    pl.add_argument("--seed", type=int, help="override the scenario's seed")
    pl.add_argument("--out", help="where to write the plan (default runs/plan-NAME-seedN.json)")
    t = sub.add_parser(
        "tune", help="find connect and exec timeouts that never fire falsely yet catch real faults"
    )
    t.add_argument("scenario", help="scenario YAML file (its load and faults)")
    t.add_argument("--connect", help="candidate connect timeouts, s (default 120,300,600,1200,2400)")
    t.add_argument("--exec", dest="exec_", help="candidate exec timeouts, s (default 60,...,3600)")
    t.add_argument("--seed", type=int, help="override the scenario's seed")
    t.add_argument("--out", help="directory (default runs/tune-NAME-TIME)")
    h = sub.add_parser(
        "hotspot", help="name the straggler rank or the degraded link of a run, from its journal"
    )
    h.add_argument("run_dir", help="a run directory (holding journal.jsonl)")
    h.add_argument("--phase", default="main", help="the phase to look at (default main)")
    w = sub.add_parser("sweep", help="run a scenario at each value of one field; goodput per value")
    w.add_argument("scenario", help="scenario YAML file")
    w.add_argument("--field", default="policy.checkpoint.every", help="dotted field (default: the interval)")
    w.add_argument("--values", required=True, help="comma-separated values, e.g. 2,3,4,6,9")
    w.add_argument("--mtbf", help="add random node kills with this mean time between failures (3600, 1h)")
    w.add_argument("--seed", type=int, help="override the scenario's seed")
    w.add_argument("--out", help="directory (default runs/sweep-NAME-TIME)")
    c = sub.add_parser("compare", help="run a scenario under several recovery strategies and tabulate them")
    c.add_argument("scenario", help="scenario YAML file")
    c.add_argument(
        "--strategies", default="restart,hot_spare", help="comma-separated (default restart,hot_spare)"
    )
    c.add_argument("--seed", type=int, help="override the scenario's seed")
    c.add_argument("--out", help="directory (default runs/compare-NAME-seedN-TIME)")
    d = sub.add_parser("drill", help="run seeded fault schedules against a scenario; shrink a failure")
    d.add_argument(
        "scenario", nargs="?", default="scenarios/drill.yaml", help="base scenario (default drill.yaml)"
    )
    d.add_argument("--seed", type=int, default=0, help="the drill's seed (default 0)")
    d.add_argument(
        "--budget", default="5m", help="time to spend drawing schedules, e.g. 90s, 5m (default 5m)"
    )
    d.add_argument("--max-faults", type=int, default=3, help="most faults in a schedule (default 3)")
    d.add_argument("--check-determinism", action="store_true", help="run each schedule twice and compare")
    d.add_argument("--kinds", help="fault kinds to draw, comma-separated (default: every drill kind)")
    d.add_argument("--out", help="directory (default runs/drill-NAME-seedN-TIME)")
    v = sub.add_parser("validate", help="check scenario files without running them")
    v.add_argument("scenarios", nargs="+", metavar="scenario", help="scenario YAML files")
    u = sub.add_parser(
        "suite", help="run scenarios as a regression suite: each must come to the verdict it declares"
    )
    u.add_argument("paths", nargs="+", metavar="path", help="scenario files, or folders of them")
    u.add_argument("--tag", action="append", default=[], help="only scenarios with this tag (repeat, or a,b)")
    u.add_argument("--junit", help="the JUnit XML file to write (default OUT/junit.xml)")
    u.add_argument("--out", help="directory (default runs/suite-TIME)")
    u.add_argument("--address", help="an existing Ray cluster to use (default: a private one on 127.0.0.1)")
    return p


def _fits_here(scenario: Scenario, address: str | None) -> None:
    """Refuse, before anything starts, a local run this machine cannot hold."""
    if address is None:
        from testbed.scenario.hostfit import refuse_unless_local_fits

        refuse_unless_local_fits(scenario.local_estimate(), scenario.where("cluster"))


def _run(args: argparse.Namespace) -> int:
    from testbed.actors.terminal import ray_output_to
    from testbed.report.progress import Progress
    from testbed.report.summary import render
    from testbed.run.runner import prepare_out_dir, run
    from testbed.scenario.parse import load_scenario

    scenario = load_scenario(args.scenario)
    if args.seed is not None:
        if args.seed < 0:
            raise ScenarioError(f"--seed {args.seed}: a seed is a non-negative integer")
        scenario = scenario.with_seed(args.seed)
    _fits_here(scenario, args.address)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else Path("runs") / f"{scenario.name}-seed{scenario.seed}-{stamp}"
    prepare_out_dir(out)
    print(f"testbed: running {scenario.name} with seed {scenario.seed}; output in {out}", flush=True)
    with ray_output_to(out / RAY_LOG) as terminal:
        progress = Progress.for_terminal(terminal.err, scenario.workload.steps)
        result = run(scenario, out, address=args.address, listener=progress)
    print(render(result.report), flush=True)
    return result.exit_code


def _compare(args: argparse.Namespace) -> int:
    from testbed.actors.terminal import ray_output_to
    from testbed.experiments.compare import compare, table
    from testbed.scenario.parse import load_scenario

    scenario = load_scenario(args.scenario)
    if args.seed is not None:
        scenario = scenario.with_seed(args.seed)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = (
        Path(args.out) if args.out else Path("runs") / f"compare-{scenario.name}-seed{scenario.seed}-{stamp}"
    )
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    names = ", ".join(strategies)
    _fits_here(scenario, None)
    print(
        f"testbed: comparing {names} on {scenario.name} (seed {scenario.seed}); output in {out}", flush=True
    )
    with ray_output_to(out / RAY_LOG):
        rows = compare(scenario, strategies, out)
    print(table(rows), flush=True)
    return 0 if all(r["verdict"] == "pass" for r in rows) else 1


def _sweep(args: argparse.Namespace) -> int:
    import yaml

    from testbed.actors.terminal import ray_output_to
    from testbed.core.units import parse_duration
    from testbed.experiments.sweep import sweep

    path = Path(args.scenario)
    if not path.is_file():
        raise ScenarioError(f"{path}: no such scenario file; give the path of a YAML scenario")
    values = [yaml.safe_load(v) for v in args.values.split(",") if v.strip()]
    mtbf = None
    if args.mtbf is not None:
        mtbf = parse_duration(args.mtbf)
        if mtbf is None or mtbf <= 0:
            raise ScenarioError(f"--mtbf {args.mtbf!r} is not a positive duration; write 3600, 90m or 1h")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else Path("runs") / f"sweep-{path.stem}-{stamp}"
    print(f"testbed: sweeping {args.field} over {values} on {path}; output in {out}", flush=True)
    with ray_output_to(out / RAY_LOG):
        summary = sweep(path, args.field, values, out, mtbf=mtbf, seed=args.seed)
    print(summary["table"])
    print(f"best measured: {args.field} = {summary['best']}")
    yd = summary.get("young_daly")
    if yd:
        print(
            f"Young/Daly: sqrt(2 x {yd['checkpoint_cost_s']:.4g} s x {yd['mtbf_s']:.4g} s) = "
            f"{yd['young_s']:.4g} s = {yd['young_steps']:.3g} steps of {yd['step_s']:.4g} s; "
            "best / optimum = "
            f"{summary['best_over_optimum']:.2f}"
        )
    return 0


def _seconds(text: str | None, default: tuple[float, ...], flag: str) -> tuple[float, ...]:
    from testbed.core.units import parse_duration

    if text is None:
        return default
    values = [parse_duration(v.strip()) for v in text.split(",") if v.strip()]
    if not values or any(v is None or v <= 0 for v in values):
        raise ScenarioError(f"{flag} {text!r}: give positive durations separated by commas, like 60,300,10m")
    return tuple(sorted(float(v) for v in values if v is not None))


def _tune(args: argparse.Namespace) -> int:
    from testbed.actors.terminal import ray_output_to
    from testbed.experiments.tune import CONNECT, EXEC, tune
    from testbed.scenario.parse import load_scenario

    scenario = load_scenario(args.scenario)
    if args.seed is not None:
        scenario = scenario.with_seed(args.seed)
    connect = _seconds(args.connect, CONNECT, "--connect")
    exec_ = _seconds(args.exec_, EXEC, "--exec")
    if any(c < 120 or c > 7200 for c in connect):
        raise ScenarioError(f"--connect {args.connect}: HCCL accepts 120 to 7200 s")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else Path("runs") / f"tune-{scenario.name}-{stamp}"
    runs = len(connect) + len(exec_)
    _fits_here(scenario, None)
    print(f"testbed: tuning timeouts on {scenario.name} ({runs} runs); output in {out}", flush=True)
    with ray_output_to(out / RAY_LOG):
        summary = tune(scenario, out, connect, exec_)
    print(summary["table"])
    advice = summary["recommended"]
    if "env" not in advice:
        print(f"no recommendation: {advice['why']}")
        return 1
    print("recommended (paste):")
    print("\n".join(f"  {line}" for line in advice["env"]))
    if summary.get("tuned"):
        print(f"re-run with them: testbed run {summary['tuned']}")
    return 0


def _schema(args: argparse.Namespace) -> int:
    import json

    from testbed.scenario.schema import scenario_schema

    print(json.dumps(scenario_schema(), indent=1))
    return 0


def _report(args: argparse.Namespace) -> int:
    import json

    from testbed.core.journal import read_journal
    from testbed.report.fault_rows import fault_rows
    from testbed.report.summary import render
    from testbed.run.runner import write_outputs

    run_dir = Path(args.run_dir)
    report_file, journal = run_dir / "report.json", run_dir / "journal.jsonl"
    if not report_file.is_file() or not journal.is_file():
        raise ScenarioError(f"{run_dir}: no report.json and journal.jsonl there; give the directory of a run")
    report = json.loads(report_file.read_text())
    events = read_journal(journal)
    report["fault_table"] = fault_rows(events)  # from the journal, as the run itself built it
    write_outputs(report, events, run_dir)
    print(render(report))
    print(f"wrote {run_dir / 'junit.xml'} and {run_dir / 'timeline.png'}")
    return int(report.get("exit_code", 0))


def _list(args: argparse.Namespace) -> int:
    from faults.kind import kinds
    from testbed.core.errors import ScenarioError as Invalid
    from testbed.core.registry import STRATEGIES
    from testbed.scenario.parse import load_scenario
    from testbed.topology.presets import PRESETS

    folder = Path(args.scenarios)
    print(f"scenarios ({folder}):")
    for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
        try:
            s = load_scenario(path)
            tags = f" [{', '.join(s.tags)}]" if s.tags else ""
            print(f"  {path.name:34} {s.description or s.name}{tags}")
        except Invalid as exc:
            problems = exc.fields.get("problems") or [str(exc)]
            print(f"  {path.name:34} INVALID: {problems[0]}")
    if not folder.is_dir():
        print(f"  (no folder {folder}: run from the repository, or pass --scenarios DIR)")
    print("fault kinds:")
    for name, kind in sorted(kinds().items()):
        print(f"  {name:34} {kind.description}")
    print("presets:")
    for name, preset in sorted(PRESETS.items()):
        print(f"  {name:34} {preset.description}")
    print("recovery strategies:")
    for name, strategy in sorted(STRATEGIES.items()):
        print(f"  {name:34} {strategy.description}")
    return 0


def _plan(args: argparse.Namespace) -> int:
    import json

    from testbed.report.fault_rows import target_of
    from testbed.scenario.parse import load_scenario
    from testbed.scenario.plan import resolved_plan

    scenario = load_scenario(args.scenario)
    if args.seed is not None:
        scenario = scenario.with_seed(args.seed)
    plan = resolved_plan(scenario)
    print(
        f"plan of {scenario.name}, seed {scenario.seed} ({len(plan['faults'])} fault(s)), "
        f"plan {plan['plan_sha256'][:12]}:"
    )
    for f in plan["faults"]:
        where = f"step {f['step']:>4} {f['point']:>20}" if "mtbf" not in f["params"] else "Poisson process"
        print(f"  {where}  {f['kind']:18} {target_of(f)}  {f['id']}")
        for arrival in f.get("arrivals", []):
            print(f"      arrival at t={arrival['t']:.6g} s: rank {arrival['ranks']}")
    out = Path(args.out) if args.out else Path("runs") / f"plan-{scenario.name}-seed{scenario.seed}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(plan, indent=1))
    print(f"wrote {out}")
    return 0


def _hotspot(args: argparse.Namespace) -> int:
    from testbed.core.journal import read_journal
    from testbed.report.hotspot import diagnose

    journal = Path(args.run_dir) / "journal.jsonl"
    if not journal.is_file():
        raise ScenarioError(
            f"{journal}: no journal there; give the directory of a run (testbed run --out DIR)"
        )
    found = diagnose(read_journal(journal), args.phase)
    print(f"{found.verdict}: {found.message}")
    for key in ("slow_ranks", "slow_links"):
        if found.evidence.get(key):
            print(f"  {key.replace('_', ' ')} (x slower): {found.evidence[key]}")
    return 0


def _drill(args: argparse.Namespace) -> int:
    from testbed.actors.terminal import ray_output_to
    from testbed.core.units import parse_duration
    from testbed.scenario.parse import load_scenario
    from testbed.testing.drill import render, run_drill
    from testbed.testing.schedules import SCHEDULE_KINDS

    scenario = load_scenario(args.scenario)
    budget = parse_duration(args.budget)
    if budget is None or budget <= 0:
        raise ScenarioError(f"--budget {args.budget!r} is not a positive duration; write 90s, 5m or 300")
    if args.seed < 0 or not 1 <= args.max_faults <= 10:
        raise ScenarioError("--seed is a non-negative integer and --max-faults is 1..10")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else Path("runs") / f"drill-{scenario.name}-seed{args.seed}-{stamp}"
    print(
        f"testbed: drilling {scenario.name} with seed {args.seed} for {budget:g} s; output in {out}",
        flush=True,
    )
    kinds = SCHEDULE_KINDS
    if args.kinds:
        kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
        unknown = sorted(set(kinds) - set(SCHEDULE_KINDS))
        if unknown or not kinds:
            raise ScenarioError(f"--kinds {args.kinds!r}: a drill draws from {', '.join(SCHEDULE_KINDS)}")
    _fits_here(scenario, None)
    with ray_output_to(out / RAY_LOG):
        result = run_drill(scenario, args.seed, budget, out, args.max_faults, args.check_determinism, kinds)
    print(render(result), flush=True)
    return result.exit_code


def _validate(args: argparse.Namespace) -> int:
    from testbed.core.units import format_bytes
    from testbed.scenario.hostfit import HostMemory
    from testbed.scenario.parse import load_scenario
    from testbed.scenario.plan import unused_link_warnings

    host, problems = HostMemory.now(), []
    for path in args.scenarios:
        try:
            s = load_scenario(path)
        except ScenarioError as exc:
            problems.append(str(exc))
            continue
        print(
            f"{path}: valid (scenario {s.name}, seed {s.seed}, {s.cluster.supernodes}x"
            f"{s.cluster.npus_per_supernode} {s.cluster.preset}, {s.workload.name} "
            f"{s.workload.layout().describe()}, {len(s.faults)} fault(s))"
        )
        for warning in (*s.warnings, *unused_link_warnings(s)):
            print(f"warning: {warning}")
        need = s.local_estimate()
        if need.total > host.available:
            print(
                f"note: a local run needs about {need.describe()}, more than this machine's "
                f"{format_bytes(host.available)} available: run it with --address of a Ray cluster"
            )
    if problems:
        raise ScenarioError("\n".join(problems))
    return 0


def _suite(args: argparse.Namespace) -> int:
    from testbed.actors.terminal import ray_output_to
    from testbed.testing import suite

    scenarios = suite.load_suite(suite.scenario_files(args.paths))
    tags = [t.strip() for raw in args.tag for t in raw.split(",") if t.strip()]
    chosen = suite.with_tags(scenarios, tags)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else Path("runs") / f"suite-{stamp}"
    for scenario in chosen if args.address is None else []:
        _fits_here(scenario, None)
    print(
        f"testbed: suite of {len(chosen)} scenario(s)"
        + (f" tagged {', '.join(tags)}" if tags else "")
        + f"; output in {out}",
        flush=True,
    )
    with ray_output_to(out / RAY_LOG) as terminal:

        def show(row: suite.SuiteRow) -> None:
            mark = "ok" if row.as_declared else "NOT AS DECLARED"
            terminal.out.write(f"  {mark:15} {row.scenario:28} {row.got} ({row.wall_s:.1f} s)\n")

        rows = suite.run_suite(chosen, out, args.address, on_row=show)
    junit = suite.write(rows, out, Path(args.junit) if args.junit else None)
    print(suite.table(rows))
    print(f"wrote {out / 'suite.json'} and {junit}")
    return suite.exit_code(rows)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``testbed`` command; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        handler = {
            "run": _run,
            "compare": _compare,
            "sweep": _sweep,
            "hotspot": _hotspot,
            "tune": _tune,
            "report": _report,
            "schema": _schema,
            "list": _list,
            "plan": _plan,
            "validate": _validate,
            "drill": _drill,
            "suite": _suite,
        }[args.command]
        return handler(args)
    except ScenarioError as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        print("testbed: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (| head): stop quietly, as other tools do
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (the interpreter flushes stdout at exit)
        return 0
    except Exception as exc:  # a testbed bug: say so plainly, never a bare traceback
        print(f"testbed: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_CRASH


if __name__ == "__main__":
    raise SystemExit(main())
