"""What must hold after any fault schedule, whatever the scenario expects: the drill's invariants.

Each is a pure function of a run's journal (and, for checkpoints, the files
it left), returning the problems found (none: it holds):

- ``steps_forward``: the main phase's steps go forward one at a time, and go
  back only to where a recovery resumed;
- ``checkpoints_verify``: every committed checkpoint still on disk verifies
  (manifest, every shard, every sha256), except one a ``storage_corrupt``
  fault changed on purpose, which must then never have been resumed from;
- ``waits_noticed``: no rank waited in a collective longer than the exec
  timeout without a failure being detected at that step;
- ``finished``: the run got to its last step (liveness, once every fault has
  healed or been recovered from);
- ``poisoned_resume_said``: no resume loaded a checkpoint written after a
  silent corruption (one no rollback had undone) without saying so: its
  ``resume`` event must carry ``verified: false``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from faults.kind import kinds
from testbed.core.errors import CheckpointError
from testbed.report.integrity_checks import tainted_checkpoints
from testbed.train import checkpoint as ckpt

Events = list[dict[str, Any]]


def _main(events: Events, name: str) -> Events:
    return [e for e in events if e.get("event") == name and e.get("phase") == "main"]


def steps_forward(events: Events, run_dir: Path) -> list[str]:
    """Each main step is the one after the last, or where a recovery said training resumes."""
    resumes = {e["resume_step"] for e in _main(events, "recovery_complete")}
    problems, last = [], 0
    for e in _main(events, "step_end"):
        step = e["step"]
        if step != last + 1 and step not in resumes and not (step == last and step in resumes):
            problems.append(f"step {step} followed step {last} with no recovery resuming there")
        last = step
    return problems


def checkpoints_verify(events: Events, run_dir: Path) -> list[str]:
    """Every committed checkpoint of the main phase still on disk verifies, but those corrupted on
    purpose, which no resume may have loaded."""
    registry = kinds()
    damaged = (
        registry[e["kind"]].damaged_checkpoint(e) if e.get("kind") in registry else None
        for e in _main(events, "fault_injected")
    )
    corrupted = {step for step in damaged if step is not None}
    problems = [
        f"the job resumed from the checkpoint of step {e['from_step']}, which a fault changed on purpose"
        for e in _main(events, "resume")
        if e.get("source") == "checkpoint" and e.get("from_step") in corrupted
    ]
    for e in _main(events, "checkpoint_committed"):
        if e["step"] in corrupted:
            continue
        path = Path(e["path"])
        if not path.is_absolute():
            path = run_dir / path
        if not path.exists():
            continue  # pruned by the retention policy, or quarantined
        try:
            ckpt.verify(path)
        except CheckpointError as exc:
            problems.append(f"the committed checkpoint of step {e['step']} does not verify: {exc}")
    return problems


def waits_noticed(events: Events, run_dir: Path) -> list[str]:
    """No wait longer than the exec timeout passed without a failure detected at that step."""
    start = next((e for e in events if e.get("event") == "run_start"), {})
    exec_s = start.get("timeouts", {}).get("exec_s")
    if exec_s is None:
        return ["the journal's run_start holds no timeouts.exec_s: cannot judge the waits"]
    failed = {e["step"] for e in _main(events, "failure_detected")}
    problems = []
    for e in _main(events, "step_end"):
        worst = max(e.get("comm_wait_s") or [0.0])
        if worst > float(exec_s) and e["step"] not in failed:
            problems.append(
                f"step {e['step']}: a rank waited {worst:.4g} s in collectives, past the exec timeout of "
                f"{float(exec_s):.4g} s, and no failure was detected"
            )
    return problems


def finished(events: Events, run_dir: Path) -> list[str]:
    """The main phase reached its last step."""
    end = next((e for e in events if e.get("event") == "phase_end" and e.get("phase") == "main"), None)
    if end is None:
        return ["the main phase never finished (no phase_end): the job did not survive the schedule"]
    done = max((e["step"] for e in _main(events, "step_end")), default=0)
    return [] if done >= end["steps"] else [f"the main phase ended at step {done} of {end['steps']}"]


def poisoned_resume_said(events: Events, run_dir: Path) -> list[str]:
    """A resume from a checkpoint that held a corruption says it was not verified."""
    taint = tainted_checkpoints(events)
    return [
        f"the job resumed from the checkpoint of step {e['from_step']}, written after the silent corruption "
        f"of step {taint[e['from_step']]}, as if it were sound (verified: {e.get('verified', 'not said')})"
        for e in _main(events, "resume")
        if e.get("source", "checkpoint") == "checkpoint"
        and taint.get(e["from_step"]) is not None
        and e.get("verified") is not False
    ]


INVARIANTS: dict[str, Callable[[Events, Path], list[str]]] = {
    "steps_forward": steps_forward,
    "checkpoints_verify": checkpoints_verify,
    "waits_noticed": waits_noticed,
    "finished": finished,
    "poisoned_resume_said": poisoned_resume_said,
}


def broken(events: Events, run_dir: Path) -> dict[str, list[str]]:
    """Every invariant that does not hold, with its problems."""
    found = {name: check(events, run_dir) for name, check in INVARIANTS.items()}
    return {name: problems for name, problems in found.items() if problems}
