"""Commands that read scenarios without running them: ``validate``, ``plan``, ``estimate``, ``list``,
``schema``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from testbed.cli.arguments import add_set, load, writable_folder
from testbed.core.errors import ScenarioError


def add(commands: Any) -> None:
    """Add this module's commands to the ``testbed`` subparsers."""
    v = commands.add_parser("validate", help="check scenario files without running them")
    v.add_argument("scenarios", nargs="+", metavar="scenario", help="scenario YAML files")
    v.set_defaults(handler=validate)
    pl = commands.add_parser(
        "plan", help="resolve a scenario's faults from its seed and write plan.json; runs nothing"
    )
    pl.add_argument("scenario", help="scenario YAML file")
    pl.add_argument("--seed", type=int, help="override the scenario's seed")
    add_set(pl)
    pl.add_argument("--out", help="where to write the plan (default runs/plan-NAME-seedN.json)")
    pl.set_defaults(handler=plan)
    es = commands.add_parser(
        "estimate", help="the analytic picture of a scenario's job (step, memory, checkpoint, goodput)"
    )
    es.add_argument("scenario", help="scenario YAML file with a job section")
    add_set(es)
    es.set_defaults(handler=estimate)
    ls = commands.add_parser(
        "list", help="the scenario library, fault kinds, presets and recovery strategies"
    )
    ls.add_argument("--scenarios", default="scenarios", help="the scenario folder (default ./scenarios)")
    ls.set_defaults(handler=list_library)
    sc = commands.add_parser("schema", help="print the JSON Schema of scenario files (for editors)")
    sc.set_defaults(handler=schema)


def validate(args: argparse.Namespace) -> int:
    """``testbed validate``: parse each file, print what it describes, its warnings and host fit."""
    from testbed.audit.scenario import is_audit, load_audit
    from testbed.core.units import format_bytes
    from testbed.scenario.hostfit import HostMemory
    from testbed.scenario.plan import plan_warnings

    host, problems = HostMemory.now(), []
    for path in args.scenarios:
        if is_audit(path):
            try:
                a = load_audit(path)
            except ScenarioError as exc:
                problems.append(str(exc))
                continue
            print(
                f"{path}: valid (resume audit {a.name} of {a.plan.entry}, {a.plan.ranks} rank(s), "
                f"{a.plan.steps} steps, {len(a.plan.cases())} case(s))"
            )
            continue
        try:
            s = load(path, None)
        except ScenarioError as exc:
            problems.append(str(exc))
            continue
        what = f"{s.workload.name} {s.workload.layout().describe()}"
        if s.serves and s.serve is not None:
            what = f"serving {s.serve.model} on {s.serve.instances} instance(s)"
        print(
            f"{path}: valid (scenario {s.name}, seed {s.seed}, {s.cluster.supernodes}x"
            f"{s.cluster.npus_per_supernode} {s.cluster.preset}, {what}, {len(s.faults)} fault(s))"
        )
        for warning in (*s.warnings, *plan_warnings(s)):
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


def plan(args: argparse.Namespace) -> int:
    """``testbed plan``: resolve the faults from the seed, print them, write plan.json."""
    from testbed.report.fault_rows import target_of
    from testbed.scenario.plan import plan_warnings, resolved_plan

    scenario = load(args.scenario, args.seed, args.sets)
    resolved = resolved_plan(scenario)
    print(
        f"plan of {scenario.name}, seed {scenario.seed} ({len(resolved['faults'])} fault(s)), "
        f"plan {resolved['plan_sha256'][:12]}:"
    )
    for f in resolved["faults"]:
        where = f"step {f['step']:>4} {f['point']:>20}" if "mtbf" not in f["params"] else "Poisson process"
        print(f"  {where}  {f['kind']:18} {target_of(f)}  {f['id']}")
        for arrival in f.get("arrivals", []):
            print(f"      arrival at t={arrival['t']:.6g} s: rank {arrival['ranks']}")
    for warning in (*scenario.warnings, *plan_warnings(scenario)):
        print(f"warning: {warning}")
    out = Path(args.out) if args.out else Path("runs") / f"plan-{scenario.name}-seed{scenario.seed}.json"
    if out.is_dir():
        raise ScenarioError(f"--out {out}: that is a folder; give the path of the plan's JSON file")
    writable_folder(out.parent, "--out")
    try:
        out.write_text(json.dumps(resolved, indent=1))
    except OSError as exc:
        raise ScenarioError(
            f"--out {out}: cannot write it ({exc.strerror}); give a file you can write"
        ) from None
    print(f"wrote {out}")
    return 0


def estimate(args: argparse.Namespace) -> int:
    """Print the analytic figures of the scenario's job and serving; nothing is started."""
    from testbed.job.estimate import render
    from testbed.scenario.job_estimate import scenario_estimate, scenario_serve_estimate
    from testbed.serve.estimate import render as render_serving

    scenario = load(args.scenario, None, args.sets)
    figures = scenario_estimate(scenario)
    serving = scenario_serve_estimate(scenario)
    if figures is None and serving is None:
        raise ScenarioError(
            f"{scenario.file}: no job or serve section to estimate; add one, e.g. "
            "'job: {model: llama3-8b, seq: 4096, global_batch: 512}' (docs/job.md) or "
            "'serve: {model: llama3-8b, batch: 32}' (docs/serving.md)"
        )
    parts = [render(figures)] if figures else []
    parts += [render_serving(serving)] if serving else []
    print("\n\n".join(parts))
    return 0


def list_library(args: argparse.Namespace) -> int:
    """``testbed list``: the scenario library, fault kinds, presets, strategies, checks, workloads."""
    from faults.kind import kinds
    from testbed.core.registry import CHECKS, STRATEGIES
    from testbed.topology.presets import PRESETS
    from workloads import WORKLOADS

    folder = Path(args.scenarios)
    print(f"scenarios ({folder}):")
    for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
        try:
            s = load(str(path), None)
            tags = f" [{', '.join(s.tags)}]" if s.tags else ""
            print(f"  {path.name:34} {s.description or s.name}{tags}")
        except ScenarioError as exc:
            problems = exc.fields.get("problems") or [str(exc)]
            print(f"  {path.name:34} INVALID: {problems[0]}")
    if not folder.is_dir():
        print(f"  (no folder {folder}: run from the repository, or pass --scenarios DIR)")
    sections: list[tuple[str, dict[str, Any]]] = [
        ("fault kinds", dict(kinds())),
        ("presets", dict(PRESETS)),
        ("recovery strategies", dict(STRATEGIES.items())),
        ("checks", dict(CHECKS.items())),
        ("workloads", dict(WORKLOADS.items())),
    ]
    for title, entries in sections:
        print(f"{title}:")
        for name, entry in sorted(entries.items()):
            print(f"  {name:34} {_describe(entry)}")
    return 0


def _describe(entry: Any) -> str:
    """The first line of what an entry says of itself (its ``description``, else its docstring)."""
    text = getattr(entry, "description", None) or (entry.__doc__ or "")
    return str(text).strip().splitlines()[0] if str(text).strip() else ""


def schema(args: argparse.Namespace) -> int:
    """``testbed schema``: the JSON Schema of scenario files."""
    from testbed.scenario.schema import scenario_schema

    print(json.dumps(scenario_schema(), indent=1))
    return 0
