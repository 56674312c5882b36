"""Commands that run a scenario many times or study one run: ``compare``, ``sweep``, ``tune``,
``sdc-sweep``, ``hotspot``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from testbed.cli.arguments import RAY_LOG, add_set, fits_here, load, out_dir, seconds, seed
from testbed.core.errors import ScenarioError


def add(commands: Any) -> None:
    """Add this module's commands to the ``testbed`` subparsers."""
    c = commands.add_parser(
        "compare", help="run a scenario under several recovery strategies and tabulate them"
    )
    c.add_argument("scenario", help="scenario YAML file")
    c.add_argument(
        "--strategies", default="restart,hot_spare", help="comma-separated (default restart,hot_spare)"
    )
    c.add_argument("--seed", type=int, help="override the scenario's seed")
    add_set(c)
    c.add_argument("--out", help="directory (default runs/compare-NAME-seedN-TIME)")
    c.set_defaults(handler=compare)
    w = commands.add_parser("sweep", help="run a scenario at each value of one field; goodput per value")
    w.add_argument("scenario", help="scenario YAML file")
    w.add_argument("--field", default="policy.checkpoint.every", help="dotted field (default: the interval)")
    w.add_argument("--values", required=True, help="comma-separated values, e.g. 2,3,4,6,9")
    w.add_argument("--mtbf", help="add random node kills with this mean time between failures (3600, 1h)")
    w.add_argument("--seed", type=int, help="override the scenario's seed")
    w.add_argument("--out", help="directory (default runs/sweep-NAME-TIME)")
    w.set_defaults(handler=sweep)
    t = commands.add_parser(
        "tune", help="find connect and exec timeouts that never fire falsely yet catch real faults"
    )
    t.add_argument("scenario", help="scenario YAML file (its load and faults)")
    t.add_argument("--connect", help="candidate connect timeouts, s (default 120,300,600,1200,2400)")
    t.add_argument("--exec", dest="exec_", help="candidate exec timeouts, s (default 60,...,3600)")
    t.add_argument("--seed", type=int, help="override the scenario's seed")
    add_set(t)
    t.add_argument("--out", help="directory (default runs/tune-NAME-TIME)")
    t.set_defaults(handler=tune)
    d = commands.add_parser(
        "sdc-sweep",
        help="sweep silent-corruption shapes x integrity detectors x hash intervals; the table a policy "
        "is picked from",
    )
    d.add_argument("scenario", help="base scenario YAML file (its cluster, job and checkpoints)")
    d.add_argument("--shapes", help="comma-separated shapes (default all: gradient-exponent, ...)")
    d.add_argument(
        "--detectors",
        default="validators,hash,both,replay,checksums",
        help="comma-separated (default all: validators,hash,both,replay,checksums)",
    )
    d.add_argument("--every", default="2,4", help="hash intervals in steps, comma-separated (default 2,4)")
    d.add_argument("--seed", type=int, help="override the scenario's seed")
    d.add_argument("--out", help="directory (default runs/sdc-sweep-NAME-TIME)")
    d.set_defaults(handler=sdc_sweep)
    h = commands.add_parser(
        "hotspot",
        help="name the straggler rank, the degraded link, the overloaded rank, the shared ingress or the "
        "placement that slowed a run, from its journal",
    )
    h.add_argument("run_dir", help="a run directory (holding journal.jsonl)")
    h.add_argument("--phase", default="main", help="the phase to look at (default main)")
    h.set_defaults(handler=hotspot)


def compare(args: argparse.Namespace) -> int:
    """``testbed compare``: the scenario under each recovery strategy, side by side."""
    from testbed.actors.terminal import ray_output_to
    from testbed.experiments.compare import compare as compare_strategies
    from testbed.experiments.compare import table

    scenario = load(args.scenario, args.seed, args.sets)
    out = out_dir(args.out, f"compare-{scenario.name}-seed{scenario.seed}")
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    fits_here(scenario, None)
    print(
        f"testbed: comparing {', '.join(strategies)} on {scenario.name} (seed {scenario.seed}); "
        f"output in {out}",
        flush=True,
    )
    with ray_output_to(out / RAY_LOG):
        rows = compare_strategies(scenario, strategies, out)
    print(table(rows), flush=True)
    print("replay a strategy's run:")
    print("\n".join(f"  {r['strategy']}: {r['replay']}" for r in rows))
    return 0 if all(r["verdict"] == "pass" for r in rows) else 1


def sweep(args: argparse.Namespace) -> int:
    """``testbed sweep``: goodput at each value of one field, against Young/Daly's optimum."""
    import yaml

    from testbed.actors.terminal import ray_output_to
    from testbed.core.units import parse_duration
    from testbed.experiments.sweep import sweep as sweep_field

    path, chosen_seed = Path(args.scenario), seed(args.seed)
    if not path.is_file():
        raise ScenarioError(f"{path}: no such scenario file; give the path of a YAML scenario")
    values = [yaml.safe_load(v) for v in args.values.split(",") if v.strip()]
    mtbf = None
    if args.mtbf is not None:
        mtbf = parse_duration(args.mtbf)
        if mtbf is None or mtbf <= 0:
            raise ScenarioError(f"--mtbf {args.mtbf!r} is not a positive duration; write 3600, 90m or 1h")
    out = out_dir(args.out, f"sweep-{path.stem}")
    print(f"testbed: sweeping {args.field} over {values} on {path}; output in {out}", flush=True)
    with ray_output_to(out / RAY_LOG):
        summary = sweep_field(path, args.field, values, out, mtbf=mtbf, seed=chosen_seed)
    print(summary["table"])
    print("replay a point:")
    print("\n".join(f"  {p['value']}: {p['replay']}" for p in summary["points"]))
    print(f"best measured: {args.field} = {summary['best']}")
    yd = summary.get("young_daly")
    if yd:
        print(
            f"Young/Daly: sqrt(2 x {yd['checkpoint_cost_s']:.4g} s x {yd['mtbf_s']:.4g} s) = "
            f"{yd['young_s']:.4g} s = {yd['young_steps']:.3g} steps of {yd['step_s']:.4g} s; "
            "best / optimum = "
            f"{summary['best_over_optimum']:.2f}"
        )
    if "fitted_steps" in summary:
        print(
            f"fitted optimum (goodput = a - b/k - c k over the points): {summary['fitted_steps']:.3g} steps; "
            f"fitted / Young/Daly = {summary['fitted_over_optimum']:.2f}"
        )
    return 0


def sdc_sweep(args: argparse.Namespace) -> int:
    """``testbed sdc-sweep``: coverage, latency, overhead and rollback per detector configuration."""
    from testbed.actors.terminal import ray_output_to
    from testbed.experiments.sdc_sweep import SHAPES
    from testbed.experiments.sdc_sweep import sdc_sweep as sweep_integrity

    path, chosen_seed = Path(args.scenario), seed(args.seed)
    if not path.is_file():
        raise ScenarioError(f"{path}: no such scenario file; give the path of a YAML scenario")
    shapes = [s.strip() for s in (args.shapes or ",".join(SHAPES)).split(",") if s.strip()]
    detectors = [d.strip() for d in args.detectors.split(",") if d.strip()]
    try:
        intervals = [int(k) for k in args.every.split(",") if k.strip()]
    except ValueError:
        raise ScenarioError(f"--every {args.every!r}: give whole numbers of steps, like 2,4") from None
    out = out_dir(args.out, f"sdc-sweep-{path.stem}")
    print(f"testbed: sweeping {len(shapes)} shape(s) x {detectors} on {path}; output in {out}", flush=True)
    with ray_output_to(out / RAY_LOG):
        summary = sweep_integrity(path, out, shapes, detectors, intervals, chosen_seed)
    print(summary["table"])
    return 0


def tune(args: argparse.Namespace) -> int:
    """``testbed tune``: connect and exec timeouts that never fire falsely yet catch real faults."""
    from testbed.actors.terminal import ray_output_to
    from testbed.experiments.tune import CONNECT, EXEC
    from testbed.experiments.tune import tune as tune_timeouts

    scenario = load(args.scenario, args.seed, args.sets)
    connect = seconds(args.connect, CONNECT, "--connect")
    exec_ = seconds(args.exec_, EXEC, "--exec")
    if any(c < 120 or c > 7200 for c in connect):
        raise ScenarioError(f"--connect {args.connect}: HCCL accepts 120 to 7200 s")
    out = out_dir(args.out, f"tune-{scenario.name}")
    fits_here(scenario, None)
    runs = len(connect) + len(exec_)
    print(f"testbed: tuning timeouts on {scenario.name} ({runs} runs); output in {out}", flush=True)
    with ray_output_to(out / RAY_LOG):
        summary = tune_timeouts(scenario, out, connect, exec_)
    print(summary["table"])
    print("why:")
    print("\n".join(f"  {line}" for line in summary["explanation"]))
    advice = summary["recommended"]
    if "env" not in advice:
        print(f"no recommendation: {advice['why']}")
        return 1
    print("recommended (paste):")
    print("\n".join(f"  {line}" for line in advice["env"]))
    if summary.get("tuned"):
        print(f"re-run with them: testbed run {summary['tuned']}")
        timeouts = ("connect_s", "exec_s", "pg_timeout_s")
        sets = " ".join(f"--set policy.timeouts.{k}={advice[k]:g}" for k in timeouts)
        print(f"  or: testbed run {scenario.file} {sets} --seed {scenario.seed}")
    return 0


def hotspot(args: argparse.Namespace) -> int:
    """``testbed hotspot``: the straggler rank, degraded link, overloaded rank, shared ingress or
    placement that slowed a run, from its journal."""
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
