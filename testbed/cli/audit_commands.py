"""``testbed audit-resume``: your own training program, killed at every phase of a step and resumed."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from testbed.cli.arguments import out_dir, writable_folder
from testbed.core.errors import ScenarioError


def add(commands: Any) -> None:
    """Add this module's commands to the ``testbed`` subparsers."""
    from testbed.audit.plan import KILL_POINTS

    a = commands.add_parser(
        "audit-resume",
        help="kill your training program at every phase of a step; prove its resume bit for bit",
        description="Run ENTRY (a file, or a dotted module, then ':factory') as fresh rank processes; "
        "kill one for real at each kill point and step, restart every rank through the program's own "
        "load, and compare every leaf of its state with an uninterrupted run. Exit 0: every case "
        "resumed bit for bit; 1: a case diverged (the first leaf is named); 254: cannot judge.",
    )
    a.add_argument("entry", help="your program: path/to/train.py[:make] or a.dotted.module[:make]")
    a.add_argument("--ranks", type=int, default=2, help="data-parallel ranks (default 2)")
    a.add_argument("--steps", type=int, default=8, help="steps of each run (default 8)")
    a.add_argument(
        "--kill-points",
        default=",".join(KILL_POINTS),
        help=f"comma-separated, from {', '.join(KILL_POINTS)} (default all)",
    )
    a.add_argument("--kill-steps", help="comma-separated steps to kill in (default the middle step)")
    a.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    a.add_argument("--save-every", type=int, default=1, help="steps between checkpoints (default 1)")
    a.add_argument("--victim", type=int, help="the rank killed (default the last)")
    a.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option for your factory (VALUE read as YAML), repeatable",
    )
    a.add_argument(
        "--no-twin-run",
        dest="twin_run",
        action="store_false",
        help="skip the second uninterrupted run (faster; a non-deterministic program then shows as "
        "divergences instead of being refused)",
    )
    a.add_argument(
        "--fresh-interpreters",
        dest="start",
        action="store_const",
        const="fresh",
        default="zygote",
        help="start every rank process as a new interpreter instead of forking it from the zygote "
        "(an interpreter that only imported numpy and PyTorch): slower, the same verdicts",
    )
    a.add_argument("--timeout", type=float, default=60.0, help="wall seconds without progress = hung")
    a.add_argument("--junit", help="also write the JUnit XML here (default OUT/junit.xml only)")
    a.add_argument("--out", help="directory (default runs/audit-NAME-TIME)")
    a.set_defaults(handler=audit_resume)


def _ints(text: str | None, flag: str) -> tuple[int, ...]:
    if text is None:
        return ()
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ScenarioError(f"{flag} {text!r}: write whole numbers separated by commas, e.g. 2,5") from None


def _options(pairs: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise ScenarioError(f"--option {pair!r}: write KEY=VALUE, e.g. --option layers=2")
        try:
            options[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise ScenarioError(f"--option {pair!r}: the value is not YAML; quote a string") from None
    return options


def audit_resume(args: argparse.Namespace) -> int:
    """``testbed audit-resume``: the sweep, its table, its JUnit file; exit 0, 1 or 254."""
    from testbed.audit.plan import AuditPlan
    from testbed.audit.sweep import audit_resume as run_audit
    from testbed.audit.sweep import table, write_junit
    from workloads.program import resolve, split_entry

    where, _ = split_entry(args.entry)
    if (where.endswith(".py") or "/" in where) and not Path(where).is_file():
        raise ScenarioError(f"{args.entry}: no such file; give the path of your training script")
    plan = AuditPlan(
        entry=resolve(args.entry, Path.cwd()),
        ranks=args.ranks,
        steps=args.steps,
        kill_points=tuple(p.strip() for p in args.kill_points.split(",") if p.strip()),
        kill_steps=_ints(args.kill_steps, "--kill-steps"),
        seeds=_ints(args.seeds, "--seeds"),
        save_every=args.save_every,
        victim=args.victim,
        options=_options(args.option),
        timeout_s=args.timeout,
        twin_run=args.twin_run,
        start=args.start,
    ).checked()
    if args.junit:
        if Path(args.junit).is_dir():
            raise ScenarioError(f"--junit {args.junit}: that is a folder; give the path of the XML file")
        writable_folder(Path(args.junit).parent, "--junit")
    name = Path(where).stem if where.endswith(".py") else where.rsplit(".", 1)[-1]
    out = out_dir(args.out, f"audit-{name}")
    cases = len(plan.cases())
    print(
        f"testbed: auditing the resume of {args.entry}: {cases} case(s) on {plan.ranks} rank(s); "
        f"output in {out}",
        flush=True,
    )
    result = run_audit(plan, out)
    print(table(result), flush=True)
    if args.junit:
        write_junit(result, Path(args.junit))
    print(f"wrote {out / 'report.json'}, {out / 'journal.jsonl'} and {args.junit or out / 'junit.xml'}")
    return result.exit_code
