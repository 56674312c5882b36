"""The scenario's safeguards: conditions that end a run (exit 3), whatever its checks would say.

After each step: a loss that is NaN or infinite (training diverged), more
failures in the main phase than ``safeguards.max_failures``, more wall time
than ``safeguards.wall_s``. A tripped safeguard is journalled with its reason
and raised as :class:`SafeguardTripped`.
"""

from __future__ import annotations

import math
import time

from testbed.actors.outcome import Outcome
from testbed.core.errors import SafeguardTripped
from testbed.core.journal import Journal
from testbed.scenario.model import Safeguards


def check_safeguards(
    guards: Safeguards, journal: Journal, wall_start: float, phase: str, step: int, out: dict[int, Outcome]
) -> None:
    """Raise :class:`SafeguardTripped` (after journalling it) when a safeguard trips at ``step``."""
    losses = [o.value["loss"] for o in out.values() if o.value.get("loss") is not None]
    why = ""
    if guards.nan_loss and any(not math.isfinite(float(x)) for x in losses):
        why = f"the loss is {losses[0]} at step {step}: training diverged (safeguards.nan_loss)"
    if guards.max_failures is not None:  # counted only when bounded: a scan of the journal
        failures = sum(
            1 for e in journal.events if e["event"] == "failure_detected" and e.get("phase") == "main"
        )
        if failures > guards.max_failures:
            why = f"{failures} failures by step {step}, past safeguards.max_failures = {guards.max_failures}"
    elapsed = time.monotonic() - wall_start
    if guards.wall_s is not None and elapsed > guards.wall_s:
        why = f"{elapsed:.1f} s of wall time by step {step}, past safeguards.wall_s = {guards.wall_s:g} s"
    if why:
        journal.emit("safeguard_tripped", phase=phase, step=step, reason=why)
        raise SafeguardTripped(why, step=step)
