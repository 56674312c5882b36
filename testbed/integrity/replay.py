"""Replaying a step the validators suspect, as Megatron's rerun state machine does, and classifying it.

Every rank goes back to its in-memory snapshot of the step's start and runs
the step again, in place:

- a different result: the first run suffered a **transient** fault; the
  replay's result is kept;
- the same result: either the result is correct or the NPU fails the same
  way each time. With ``elsewhere``, the suspect ranks run the step once
  more as on another NPU (free of their own corruption). The same result
  there means it was **correct** (a false alarm: the spike was the data's),
  and a different one means a **persistent** fault of the suspect NPU. The
  healthy result is kept. Without ``elsewhere`` the replay cannot tell
  them apart: it is **reproducible**, and the result is kept as it is.

Replays cost their steps' virtual time, and the replays thrown away count
as recovery. A transient or persistent verdict is a strike against the
suspect ranks. A correct one is not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from testbed.actors.outcome import Outcome
from testbed.integrity.detectors import Alarm
from testbed.integrity.inspector import Inspector
from testbed.recovery.context import Phase, RecoveryContext
from testbed.recovery.detect import completed_in_place

Outcomes = dict[int, Outcome]


@dataclass(frozen=True)
class Replayed:
    """What a replay concluded: the result kept, the verdict, the NPUs it blames, those struck out."""

    out: Outcomes
    verdict: str
    ranks: tuple[int, ...]
    exclude: tuple[int, ...] = ()


def _digests(out: Outcomes) -> dict[int, str]:
    return {r: str(o.value["digest"]) for r, o in out.items()}


def _end(out: Outcomes) -> float:
    return max(float(o.value["t"]) for o in out.values())


def replay_step(
    ctx: RecoveryContext,
    inspector: Inspector,
    phase: Phase,
    step: int,
    out: Outcomes,
    alarm: Alarm,
    t: float,
) -> Replayed | None:
    """Replay ``step`` from its snapshot and classify it; None when a replay itself failed (the
    caller then goes back to a checkpoint)."""
    wall_start = time.monotonic()
    ranks = sorted(out)
    again = ctx.cluster.call("rerun_step", step, t, ranks=ranks)
    if not all(o.ok for o in again.values()):
        return None
    suspects = tuple(alarm.ranks) or tuple(ranks)
    kept, verdict, t_kept = again, "transient", t
    if _digests(again) == _digests(out):
        verdict = "reproducible"
        elsewhere = inspector.policy.replay is not None and inspector.policy.replay.elsewhere
        if elsewhere:
            t_kept = _end(again)
            there = ctx.cluster.call(
                "rerun_step", ranks=ranks, per_rank=lambda r: (step, t_kept, r in suspects)
            )
            if not all(o.ok for o in there.values()):
                return None
            verdict = "correct" if _digests(there) == _digests(again) else "persistent"
            kept = there
    blamed = suspects if verdict in ("transient", "persistent") else ()
    exclude = inspector.strike(step, Alarm(alarm.detector, blamed, alarm.reason)) if blamed else ()
    t_done = _end(kept)
    ctx.journal.emit(
        "sdc_replay",
        phase=phase.name,
        step=step,
        verdict=verdict,
        ranks=list(blamed),
        suspects=list(suspects),
        t_start=t,
        t=t_done,
    )
    detection = (t, t, alarm.detector)
    completed_in_place(
        ctx, phase, step, detection, t_kept, t_done, {"replay_s": t_kept - t}, "replay", wall_start
    )
    return Replayed(kept, verdict, blamed, exclude)
