"""``testbed export``: a run's virtual timeline in another tool's format (a Chrome/Perfetto trace)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from testbed.core.errors import ScenarioError, TestbedError
from testbed.core.journal import read_journal
from testbed.report.chrome_trace import chrome_trace

#: each format ``--format`` takes, to the function of the journal's events that makes it
FORMATS = {"chrome-trace": chrome_trace}


def add(commands: Any) -> None:
    """Add this module's commands to the ``testbed`` subparsers."""
    e = commands.add_parser(
        "export",
        help="write a run's virtual timeline as a Chrome/Perfetto trace (ui.perfetto.dev, chrome://tracing)",
        description="Read RUN_DIR's journal and write its main phase on the virtual clock as a trace: "
        "a track per rank (steps, collectives, bubbles, data waits, checkpoint writes, recoveries, "
        "faults) and per link (its busy time per step). See docs/trace.md.",
    )
    e.add_argument("run_dir", help="a run directory (holding journal.jsonl)")
    e.add_argument("--format", default="chrome-trace", help=f"one of {', '.join(FORMATS)} (the default)")
    e.add_argument("--out", help="the file to write (default RUN_DIR/trace.json)")
    e.set_defaults(handler=export)


def export(args: argparse.Namespace) -> int:
    """Write the trace of ``args.run_dir``'s journal to ``args.out``; exit 0."""
    make = FORMATS.get(args.format)
    if make is None:
        raise ScenarioError(f"--format {args.format!r}: give one of {', '.join(FORMATS)}")
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise ScenarioError(f"{run_dir}: no such folder; give the directory of a run")
    journal = run_dir / "journal.jsonl"
    if not journal.is_file():
        raise ScenarioError(f"{run_dir}: no journal.jsonl there; give the directory of a run")
    try:
        trace = make(read_journal(journal))
    except TestbedError as err:
        raise ScenarioError(str(err)) from None
    except (KeyError, TypeError, ValueError) as err:
        raise ScenarioError(f"{journal}: an event lacks what a run's journal holds ({err!r})") from None
    out = Path(args.out) if args.out else run_dir / "trace.json"
    if out.is_dir():
        raise ScenarioError(f"--out {out}: that is a folder; give the path of the file to write")
    try:
        out.write_text(json.dumps(trace), encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(
            f"--out {out}: cannot write it ({exc.strerror}); give a file you can write"
        ) from None
    count = len(trace["traceEvents"])
    print(f"trace: {out} ({count} events; open it in https://ui.perfetto.dev or chrome://tracing)")
    return 0
