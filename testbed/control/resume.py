"""``testbed resume RUN_DIR``: a run whose controller died goes on from its journal and checkpoints.

The controller is the one process that holds the run: the journal, the plan,
every rank's handle. When it dies (a ``controller_kill`` fault, a crash, a
``kill -9``), its Ray actors and NPU processes die with it, and all that is
left is on disk: the journal (perhaps with a torn last line) and the
committed checkpoints. A resume checks the folder is a run that did not end,
of the scenario and the testbed version it was started with, and changes
nothing in it unless it is; then it drops a torn last line, starts a new
cluster, and trains from the newest committed checkpoint that verifies, as a
restart after a failure does (detected by ``controller``: the launcher saw
its process go). The faults the journal says fired do not fire again; those
still in force are put back, and Poisson arrivals go on where they were
(:mod:`testbed.control.in_force`). The run then ends as any run does: the
reference phase, the checks, the report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.control.conclusion import HEAD_LOST, conclude
from testbed.control.controller import Controller
from testbed.control.drive import drive
from testbed.control.in_force import rearmed, restore_in_force
from testbed.control.job_run import take_over
from testbed.control.state import PhaseState
from testbed.core.errors import ScenarioError, TestbedError
from testbed.core.journal import Journal, last_time, read_journal
from testbed.recovery.restart import from_storage
from testbed.report.run_report import Report
from testbed.scenario.model import Scenario
from testbed.scenario.plan import make_plan

#: the copy of the scenario's file a run keeps in its folder, so a resume needs nothing else
SCENARIO_COPY = "scenario.yaml"


def version() -> str:
    """The testbed's version (its package's), which a resume must share with the run it goes on with."""
    from importlib.metadata import version as installed

    return installed("supernode-testbed")


def keep_scenario(scenario: Scenario, run_dir: Path) -> None:
    """Copy the scenario's file into the run's folder (nothing for a scenario built in code)."""
    if scenario.file and Path(scenario.file).is_file():
        text = Path(scenario.file).read_text(encoding="utf-8")
        (run_dir / SCENARIO_COPY).write_text(text, encoding="utf-8")


@dataclass(frozen=True)
class Interrupted:
    """A run whose controller died: its scenario, its journal so far, and a torn tail to drop."""

    run_dir: Path
    scenario: Scenario
    events: list[dict[str, Any]]
    torn_bytes: int
    #: bytes of the ending a run whose Ray head was lost wrote (its error, its end): cut, then resumed
    ended_bytes: int = 0

    @property
    def run_id(self) -> str:
        """The run's id, which the resumed journal keeps."""
        return str(self.events[0]["run"])

    @property
    def t_lost(self) -> float:
        """When the controller died, on the virtual clock: its kill's, else the journal's last time."""
        killed = [e for e in self.events if e.get("event") in ("controller_killed", "ray_head_lost")]
        if killed:
            return float(killed[-1]["t"])
        return last_time(self.events)


def _refuse(run_dir: Path, why: str, fix: str) -> ScenarioError:
    return ScenarioError(f"{run_dir}: {why}; {fix}. Nothing in the folder was changed.", run_dir=str(run_dir))


def _scenario_of(run_dir: Path, start: dict[str, Any], file: str | Path | None) -> Scenario:
    """The scenario as the run started it: ``file`` (else its copy in the folder), with the run's
    changes and seed."""
    from testbed.scenario.overrides import apply

    path = Path(file) if file is not None else run_dir / SCENARIO_COPY
    if not path.is_file():
        if file is not None:
            raise _refuse(run_dir, f"{path}: no such scenario file", "give the file the run started with")
        raise _refuse(
            run_dir,
            f"it holds no {SCENARIO_COPY} (its scenario was built in code, not read from a file)",
            "resume it from the program that built it (testbed.resume(run_dir, scenario))",
        )
    text = path.read_text(encoding="utf-8")
    name = str(file) if file is not None else str(start.get("file") or path)
    return apply(text, name, tuple(start.get("overrides", ()))).with_seed(int(start["seed"]))


def interrupted(
    run_dir: str | Path, scenario: Scenario | None = None, scenario_file: str | Path | None = None
) -> Interrupted:
    """The run in ``run_dir`` if it can be resumed, as ``scenario`` when given (else the scenario of
    ``scenario_file``, else of the folder's copy, with the run's changes and seed); else a
    :class:`ScenarioError` that says why, with nothing in the folder changed."""
    run_dir = Path(run_dir)
    path = run_dir / "journal.jsonl"
    if not run_dir.is_dir():
        raise _refuse(run_dir, "no such folder", "give the folder a run wrote (testbed run --out)")
    if not path.is_file():
        raise _refuse(run_dir, "not a run: it holds no journal.jsonl", "give the folder a run wrote")
    try:
        events = read_journal(path)
    except TestbedError as exc:
        raise _refuse(run_dir, f"its journal cannot be read ({exc})", "it cannot be resumed") from None
    start = events[0] if events else {}
    if start.get("event") != "run_start":
        raise _refuse(run_dir, "not a run: its journal does not begin with run_start", "give a run's folder")
    ended = _head_lost_ending(events)
    if ended is None and any(e.get("event") == "run_end" for e in events):
        raise _refuse(run_dir, "this run ended: there is nothing to resume", "read its report.json")
    if start.get("testbed_version") != version():
        raise _refuse(
            run_dir,
            f"it was run by testbed {start.get('testbed_version') or 'before 0.2.0'}, this is {version()}",
            "resume it with the version that started it, or run the scenario again",
        )
    if any(e.get("event") == "phase_end" and e.get("phase") == "main" for e in events):
        raise _refuse(
            run_dir,
            "its main phase ended before the controller died (in the reference or probe phase)",
            "run the scenario again: only the main phase is resumed",
        )
    scenario = scenario if scenario is not None else _scenario_of(run_dir, start, scenario_file)
    if scenario.digest() != start.get("scenario_sha256"):
        raise _refuse(
            run_dir,
            f"it is a run of another scenario: {scenario.name} (seed {scenario.seed}, changes "
            f"{list(scenario.overrides) or 'none'}) is not the one it started with, by its sha256",
            "resume with the scenario the run started with",
        )
    data = path.read_bytes()
    if ended is not None:  # the lines from the run's error on: whole lines, one per event
        cut = sum(len(line) + 1 for line in data.split(b"\n")[ended:])
        return Interrupted(run_dir, scenario, events[:ended], 0, cut - 1)
    return Interrupted(run_dir, scenario, events, len(data) - (data.rfind(b"\n") + 1))


def _head_lost_ending(events: list[dict[str, Any]]) -> int | None:
    """Where the ending of a run stopped by the loss of Ray's head begins (its ``run_error``), if it
    is one: that run goes on, on another Ray, from its committed checkpoints."""
    for i, e in enumerate(events):
        if e.get("event") == "run_error":
            return i if e.get("outcome") == HEAD_LOST and events[-1].get("event") == "run_end" else None
    return None


def drop_torn_tail(found: Interrupted) -> None:
    """Cut a torn last line (no newline after it) from the journal, so new events follow whole ones."""
    if found.torn_bytes or found.ended_bytes:
        path = found.run_dir / "journal.jsonl"
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size - found.torn_bytes - found.ended_bytes)


def resumed_journal(found: Interrupted, listener: Any = None) -> Journal:
    """The run's journal, reopened to go on after its last event (numbering and all)."""
    drop_torn_tail(found)
    journal = Journal(found.run_dir / "journal.jsonl", found.run_id, listener, prior=found.events)
    journal.emit(
        "controller_resumed",
        t_lost=found.t_lost,
        torn_bytes=found.torn_bytes,
        last_seq=found.events[-1].get("seq"),
        testbed_version=version(),
    )
    return journal


class ResumedController(Controller):
    """A controller that takes over a run from its journal: the main phase from the newest committed
    checkpoint (a restart, detected by ``controller``), then the reference phase, as any run."""

    def __init__(self, *args: Any, prior: list[dict[str, Any]], t_lost: float, **kwargs: Any) -> None:
        """As :class:`Controller`, with the journal so far (``prior``) and when the controller died."""
        super().__init__(*args, **kwargs)
        self.prior = prior
        self.t_lost = t_lost
        self.resume_at = 0.0  # no step of the resumed main phase starts before its restart is done

    def train(self, phase: PhaseState, first_step: int, not_before: float = 0.0) -> None:
        """As :meth:`Controller.train`; the main phase's first step waits for the restart."""
        at = self.resume_at if phase.name == "main" else 0.0
        super().train(phase, first_step, max(not_before, at))

    def run(self) -> None:
        """Restart from storage, train the rest of the main phase, then the reference phase."""
        fired = {str(e["id"]) for e in self.prior if e.get("event") == "fault_injected" and "id" in e}
        plan = make_plan(self.scenario)
        self.faults.arrivals = rearmed(plan, self.scenario.seed, self.prior)
        main = PhaseState("main", [f for f in plan if "mtbf" not in f.params], self.ckpt_dir, fired=fired)
        take_over(self.scenario, self.cluster, self.journal, self.state)
        self.epoch = max((int(e["epoch"]) for e in self.prior if e.get("event") == "group_open"), default=-1)
        step = 1 + max((int(e["step"]) for e in self.prior if e.get("event") == "step_end"), default=0)
        # the launcher saw the controller's process exit at once; a lost head, the head watch
        by = "ray_head" if any(e.get("event") == "ray_head_lost" for e in self.prior) else "controller"
        self.journal.emit(
            "failure_detected",
            phase="main",
            step=step,
            dead=sorted(self.cluster.npus),
            t_death=self.t_lost,
            t=self.t_lost,
            detected_by=by,
            killed=[],
            errors={},
        )
        lost = (self.t_lost, self.t_lost, by)
        rec = from_storage(self, main, step, [], lost, time.monotonic())
        resume_step, self.resume_at = self._went_back(main, rec)
        restore_in_force(self.faults, self.prior, self.t_lost, step)
        try:
            self._phase(main, resume_step)
        finally:
            self.faults.journal_hits("main")
        self.against_uninterrupted()


def resume(
    run_dir: str | Path,
    scenario: Scenario | None = None,
    address: str | None = None,
    listener: Any = None,
    storage: str | None = None,
) -> Report:
    """Go on with the run in ``run_dir`` whose controller died, to its end and its report (refused, with
    nothing changed, unless :func:`interrupted` finds it resumable). ``scenario``: the run's, when it
    was built in code; ``storage``: where its checkpoints are, when not in the folder (else the
    storage the run journalled)."""
    found = interrupted(run_dir, scenario)
    shared = next((e for e in found.events if e.get("event") == "storage_shared"), None)
    if storage is None and shared is not None:  # the storage it named; not its own folder
        own = Path(shared["checkpoints"]).resolve() == (found.run_dir / "checkpoints").resolve()
        storage = None if own else str(shared["storage"])
    where = (address, storage)
    journal = resumed_journal(found, listener)
    wall0 = time.monotonic()

    def controller(*args: Any) -> Controller:
        return ResumedController(*args, prior=found.events, t_lost=found.t_lost)

    def body() -> Callable[[], None]:
        return drive(found.scenario, journal, found.run_dir, where, found.run_id, controller)

    return conclude(found.scenario, journal, found.run_dir, wall0, body)
