"""``testbed``: run, plan, compare, sweep, tune, drill, validate and list scenarios; re-render a run's
report; find its hotspot; audit the resume of your own training program.

Each command lives in one module of this package, which adds its own
subparser (``add(commands)``) and names its handler; :func:`main` only parses
and maps errors to exit codes. A new command is a function and an ``add`` line
in the module of its kind (see docs/architecture.md).

Exit codes: 0 pass, 1 a check failed, 2 unknown, 3 aborted
by a safeguard, 130 interrupted (Ctrl-C), 254 invalid scenario or arguments,
255 testbed crash.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import NoReturn

from testbed.cli import (
    audit_commands,
    experiment_commands,
    export_commands,
    run_commands,
    scenario_commands,
)
from testbed.control.runner import EXIT_CRASH, EXIT_INVALID
from testbed.core.errors import ScenarioError

#: the modules whose ``add`` registers commands, in the order ``testbed --help`` lists them
_COMMAND_MODULES = (run_commands, scenario_commands, experiment_commands, audit_commands, export_commands)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"testbed: error: {message}; see 'testbed --help'\n")
        raise SystemExit(EXIT_INVALID)


def parser() -> argparse.ArgumentParser:
    """The ``testbed`` argument parser, with every command's subparser."""
    p = _Parser(prog="testbed", description="Rehearse training failures on a modelled supernode cluster.")
    commands = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for module in _COMMAND_MODULES:
        module.add(commands)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``testbed`` command; returns the exit code."""
    args = parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
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


__all__ = ["main", "parser"]
