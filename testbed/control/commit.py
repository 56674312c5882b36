"""Writing and committing a checkpoint, as a real job does.

Every rank writes its shard of the included components into a temporary
directory (after a barrier); when all have, a manifest records them with
their sha256 and the directory is renamed into place: the commit. The write
costs ``bytes / storage bandwidth`` of virtual time (shared storage); an
asynchronous save holds training only for its snapshot to host memory. A
rank that dies writing leaves the checkpoint uncommitted; write errors
alone (a full disk) are journalled and training goes on. A checkpoint that
exists already (written before a restart) is kept if it verifies, else moved
aside and written again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from testbed.actors.outcome import Outcome
from testbed.control.controller_loss import die_if_armed
from testbed.control.state import PhaseState, RunState
from testbed.core.errors import CheckpointError
from testbed.core.journal import Journal
from testbed.scenario.model import Scenario
from testbed.train import checkpoint as ckpt


@dataclass(frozen=True)
class Written:
    """What a checkpoint's write came to."""

    #: when training may go on (virtual; 0 when nothing was committed)
    t_resume: float = 0.0
    #: every rank's outcome, when a rank died writing (the checkpoint stays uncommitted)
    failed: dict[int, Outcome] | None = None


def write_checkpoint(
    scenario: Scenario,
    state: RunState,
    journal: Journal,
    phase: PhaseState,
    step: int,
    timeouts: dict[str, float] | None,
    on_hold: Callable[[float], None],
    deadline: Callable[[], float | None] = lambda: None,
) -> Written:
    """Write and commit the checkpoint of ``step`` (``timeouts``: learned ones the manifest keeps;
    ``on_hold`` is told how long a synchronous write held training, for the learned timeout;
    ``deadline``, asked once the shards are written: when a preempted writer is SIGKILLed, past
    which the checkpoint cannot commit and its temporary directory is left unpublished)."""
    assert phase.ckpt_root is not None
    final = ckpt.step_dir(phase.ckpt_root, step)
    if final.exists():  # written before a restart: keep it if it verifies, else write it again
        try:
            ckpt.verify(final)
            journal.emit("checkpoint_exists", phase=phase.name, step=step)
            return Written()
        except CheckpointError as exc:
            moved = ckpt.quarantine(final)
            journal.emit(
                "checkpoint_quarantined", phase=phase.name, step=step, reason=str(exc), to=str(moved)
            )
    include = list(scenario.policy.checkpoint.include)
    tmp = ckpt.step_dir(phase.ckpt_root, step, tmp=True)
    tmp.mkdir(parents=True, exist_ok=True)
    out = state.cluster.call("save_shard", str(tmp), include)
    if not all(o.ok for o in out.values()):
        return _failed(journal, phase, step, tmp, out)
    shards = {r: o.value for r, o in out.items()}
    t_saved, t_resume, t_end, nbytes, write_s = _times(scenario, state, shards)
    killed_at = deadline()
    if killed_at is not None and t_end > killed_at:  # the writers are gone before it could commit
        journal.emit(
            "checkpoint_unpublished",
            phase=phase.name,
            step=step,
            path=str(tmp),
            t_saved=t_saved,
            t_commit=t_end,
            deadline=killed_at,
            write_s=write_s,
            bytes=nbytes,
        )
        return Written()
    manifest = _manifest(scenario, state, step, include, shards, t_end, timeouts)
    full = state.commit_full
    try:
        path = ckpt.commit(
            phase.ckpt_root,
            step,
            manifest,
            hook=lambda at: die_if_armed(state.controller_kill, journal, at, t_end, checkpoint=step),
            disk=ckpt.full_at(*full) if full else ckpt.room,
        )
    except CheckpointError as exc:  # the storage refused the commit: train on, from the last one
        journal.emit(
            "checkpoint_failed",
            phase=phase.name,
            step=step,
            path=str(tmp),
            written=sorted(shards),
            errors={"commit": str(exc)},
        )
        return Written()
    journal.emit(
        "checkpoint_committed",
        phase=phase.name,
        step=step,
        path=str(path),
        include=include,
        ranks={str(r): sorted(s["entries"]) for r, s in shards.items()},
        audit={str(r): s["audit"] for r, s in shards.items()},
        layout=manifest["layout"],
        world=manifest["world"],
        bytes=nbytes,
        write_s=write_s,
        t=t_end,
        t_saved=t_saved,
        t_resume=t_resume,
        asynchronous=scenario.policy.checkpoint.async_,
        paused={str(r): s for r, s in sorted(state.ckpt_pause.items())},
    )
    paused, state.ckpt_pause = state.ckpt_pause, {}
    for r, extra in paused.items():  # a paused writer goes on later; the others wait for it in step+1
        state.held_until[r] = t_resume + extra
    if not scenario.policy.checkpoint.async_:  # an async save's hold is only its snapshot: not learned
        on_hold(t_resume - t_saved + max(paused.values(), default=0.0))
    removed = ckpt.prune(phase.ckpt_root, scenario.policy.checkpoint.keep, state.verified_steps)
    if removed:
        journal.emit("checkpoint_pruned", phase=phase.name, steps=removed)
    return Written(t_resume=t_resume)


def _failed(journal: Journal, phase: PhaseState, step: int, tmp: Any, out: dict[int, Outcome]) -> Written:
    """A write some rank did not finish: journalled; a failure to recover from if a rank died."""
    written = sorted(r for r, o in out.items() if o.ok)
    errors = {str(r): str(o.error) for r, o in out.items() if isinstance(o.error, CheckpointError)}
    journal.emit(
        "checkpoint_failed", phase=phase.name, step=step, path=str(tmp), written=written, errors=errors
    )
    if len(errors) + len(written) == len(out):  # write errors only, no process lost: train on
        return Written()
    return Written(failed=out)


def _times(
    scenario: Scenario, state: RunState, shards: dict[int, Any]
) -> tuple[float, float, float, int, float]:
    """(saved, training goes on, persisted, bytes, write seconds), virtual: a synchronous write holds
    training for the whole write; an async one for the slowest rank's snapshot over HBM bandwidth,
    while the shared storage takes the bytes in the background."""
    nbytes = sum(e["bytes"] for s in shards.values() for e in s["entries"].values())
    if state.job_checkpoint:  # each component at the job's size, the small ones as written
        written: dict[str, int] = {}
        for s in shards.values():
            for component, e in s["entries"].items():
                written[component] = written.get(component, 0) + int(e["bytes"])
        modelled = sum(state.job_checkpoint.get(c, n) for c, n in written.items())
        state.state_scale = modelled / max(1, nbytes)  # a load of what this wrote takes as long
    scale = state.state_scale
    write_s = float(nbytes) * scale / state.storage_Bps
    t_saved = float(max(s["t"] for s in shards.values()))
    if scenario.policy.checkpoint.async_:
        rank_bytes = max(sum(e["bytes"] for e in s["entries"].values()) for s in shards.values())
        t_resume = t_saved + rank_bytes * scale / state.cluster.topology.preset.hbm_Bps
        return t_saved, t_resume, t_resume + write_s, nbytes, write_s
    return t_saved, t_saved + write_s, t_saved + write_s, nbytes, write_s


def _manifest(
    scenario: Scenario,
    state: RunState,
    step: int,
    include: list[str],
    shards: dict[int, Any],
    t_end: float,
    timeouts: dict[str, float] | None,
) -> dict[str, Any]:
    w = scenario.workload
    manifest: dict[str, Any] = {
        "step": step,
        "world": state.cluster.topology.world,
        "layout": {"dp": w.dp, "tp": w.tp, "pp": w.pp, "ep": w.ep},
        "workload": w.name,
        "seed": scenario.seed,
        "include": include,
        "ranks": {str(r): s["entries"] for r, s in shards.items()},
        "t_persisted": t_end,
    }
    if timeouts is not None:
        manifest["timeouts"] = timeouts
    return manifest
