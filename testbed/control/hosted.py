"""A run whose controller is to be killed for real runs it in a process of its own.

A ``controller_kill`` fault SIGKILLs the process that drives the run, so that
process cannot be the caller's (a test session, a suite, a program of the
user's). :func:`hosted_run` starts the run in a child process (spawned, so it
shares nothing with the caller but the scenario), waits for it with a bound,
and when the child died of the kill its scenario injected, resumes the run in
the caller, as ``testbed resume`` would: the scenario rehearses the whole
cycle of losing the controller and going on without it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from faults.control_plane import kills_controller
from testbed.control.controller_loss import HOSTED_ENV
from testbed.control.resume import resume
from testbed.core.errors import HarnessHang
from testbed.core.journal import read_journal
from testbed.report.run_report import Report
from testbed.scenario.model import Scenario

#: the longest a hosted run may take before it counts as hung (wall seconds)
HOSTED_BOUND_S = 3600.0


def needs_host(scenario: Scenario) -> bool:
    """Whether ``scenario`` kills its controller (then its run is hosted in a process of its own)."""
    return kills_controller(scenario.faults) and os.environ.get(HOSTED_ENV) != str(os.getpid())


def _ray_address(address: str | None) -> str | None:
    """The Ray the child should join: the caller's own, when it has one running (a test session)."""
    if address is not None:
        return address
    import ray

    return str(ray.get_runtime_context().gcs_address) if ray.is_initialized() else None


def become_host() -> None:
    """Mark this process as hosting a run whose controller may be killed (a hosted child's first act)."""
    os.environ[HOSTED_ENV] = str(os.getpid())


def hosted_run(
    scenario: Scenario,
    out_dir: Path,
    run_here: Callable[[Scenario, str, str | None, str | None], None],
    address: str | None = None,
    listener: Any = None,
    storage: str | None = None,
) -> Report:
    """Run ``scenario`` with ``run_here`` (a module-level function, which calls :func:`become_host`)
    in a spawned child process; after the controller kill the scenario injects, resume it here."""
    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=run_here, args=(scenario, str(out_dir), _ray_address(address), storage))
    child.start()
    try:
        child.join(HOSTED_BOUND_S)
    except KeyboardInterrupt:
        child.join(60)  # it got the Ctrl-C too: let it write its report
        raise
    if child.is_alive():
        child.kill()
        child.join(10)
        raise HarnessHang(f"the hosted run of {scenario.name} outlasted {HOSTED_BOUND_S:g} s; it was ended")
    killed = any(e.get("event") == "controller_killed" for e in read_journal(out_dir / "journal.jsonl"))
    if child.exitcode == -signal.SIGKILL and killed:
        print(
            f"the controller of {scenario.name} was killed, as the scenario says: resuming from the "
            f"journal and the committed checkpoints (testbed resume {out_dir})",
            file=sys.stderr,
        )
        return resume(out_dir, scenario, address, listener, storage)
    report = out_dir / "report.json"
    if not report.is_file():
        raise HarnessHang(
            f"the hosted run of {scenario.name} ended (exit {child.exitcode}) without a report; "
            f"its journal is {out_dir / 'journal.jsonl'}"
        )
    return Report.read(out_dir)
