"""A run whose controller is to be killed for real runs it in a process of its own.

A ``controller_kill`` fault SIGKILLs the process that drives the run, so that
process cannot be the caller's (a test session, a suite, a program of the
user's). :func:`hosted_run` starts the run in a child process (spawned, so it
shares nothing with the caller but the scenario and Ray), waits for it with a
bound, and when the child died of a kill its scenario injected, resumes the
run in another, as ``testbed resume`` would, as many times as the scenario
kills its controller: the scenario rehearses the whole cycle of losing the
controller and going on without it.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from faults.control_plane import kills_controller
from testbed.actors.session import RaySession
from testbed.control.controller_loss import become_host, hosted
from testbed.control.resume import resume
from testbed.core.errors import HarnessHang
from testbed.core.journal import read_journal
from testbed.report.run_report import Report
from testbed.scenario.model import Scenario

#: the longest a hosted run may take before it counts as hung (wall seconds)
HOSTED_BOUND_S = 3600.0


def needs_host(scenario: Scenario) -> bool:
    """Whether ``scenario`` kills its controller and this process does not host it yet (then its run
    is hosted in a process of its own)."""
    return kills_controller(scenario.faults) and not hosted()


def resume_as_host(scenario: Scenario, out_dir: str, address: str | None, storage: str | None) -> None:
    """In a hosted process: resume the run in ``out_dir`` (whose controller was killed) there."""
    become_host()
    resume(out_dir, scenario, address, storage=storage)


def _connected_address() -> str:
    """The address of the Ray this process is connected to (the caller's, or one it started)."""
    import ray

    return str(ray.get_runtime_context().gcs_address)


def _lives(scenario: Scenario) -> int:
    """How many controller processes a run may take: one, and one more for each kill it plans."""
    return 1 + sum(1 for f in scenario.faults if kills_controller([f]))


def _kills(out_dir: Path) -> int:
    return sum(1 for e in read_journal(out_dir / "journal.jsonl") if e.get("event") == "controller_killed")


def _host(target: Callable[..., None], args: tuple[Any, ...], name: str) -> int | None:
    """Run ``target(*args)`` in a spawned process, to its end (bounded); its exit code."""
    child = multiprocessing.get_context("spawn").Process(target=target, args=args)
    child.start()
    try:
        child.join(HOSTED_BOUND_S)
    except KeyboardInterrupt:
        child.join(60)  # it got the Ctrl-C too: let it write its report
        raise
    if child.is_alive():
        child.kill()
        child.join(10)
        raise HarnessHang(f"the hosted run of {name} outlasted {HOSTED_BOUND_S:g} s; it was ended")
    return child.exitcode


def hosted_run(
    scenario: Scenario,
    out_dir: Path,
    run_here: Callable[[Scenario, str, str | None, str | None], None],
    address: str | None = None,
    storage: str | None = None,
) -> Report:
    """Run ``scenario`` with ``run_here`` (a module-level function that calls :func:`become_host`) in
    a spawned process, and after each controller kill the scenario injects, resume it in another,
    as ``testbed resume`` would; the run's :class:`Report` once a controller saw it to its end. The
    processes share one Ray: the caller's, else one started here for them all."""
    with RaySession(address):
        joined = address or _connected_address()
        target: Callable[..., None] = run_here
        for _ in range(_lives(scenario)):
            before = _kills(out_dir) if (out_dir / "journal.jsonl").is_file() else 0
            code = _host(target, (scenario, str(out_dir), joined, storage), scenario.name)
            if code != -signal.SIGKILL or _kills(out_dir) == before:
                break
            print(
                f"the controller of {scenario.name} was killed, as the scenario says: resuming from the "
                f"journal and the committed checkpoints (testbed resume {out_dir})",
                file=sys.stderr,
                flush=True,
            )
            target = resume_as_host
    if not (out_dir / "report.json").is_file():
        raise HarnessHang(
            f"the hosted run of {scenario.name} ended (exit {code}) without a report; its journal is "
            f"{out_dir / 'journal.jsonl'}: testbed resume {out_dir} goes on with it"
        )
    return Report.read(out_dir)
