"""A recovery strategy: journal which ranks a failure took, then restart from the newest checkpoint."""

from __future__ import annotations

from typing import Any

import testbed


def note_failure(ctx: testbed.RecoveryContext, phase: Any, step: int, out: dict[int, Any]) -> dict[int, Any]:
    """A cure that cures nothing: it writes a ``plugin_note`` event and leaves the step failed, so the
    strategy goes back (a restart)."""
    failed = sorted(rank for rank, outcome in out.items() if not outcome.ok)
    ctx.journal.emit("plugin_note", phase=phase.name, step=step, failed_ranks=failed, t=ctx.now())
    return out


NOTED_RESTART = testbed.Strategy(
    "noted_restart",
    "journal which ranks failed, then restart from the newest committed checkpoint",
    cures=(note_failure,),
)
