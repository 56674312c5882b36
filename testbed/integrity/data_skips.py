"""The data a run skips after a detection: PaLM's remedy for a loss spike, restart from a checkpoint
before it and skip the batches around it (Chowdhery et al. 2022, section 5.1).

A rollback to the checkpoint of step ``c`` after a detection at step ``d``
throws away every batch the abandoned steps ``c+1..d`` drew: one per step,
and any they had skipped themselves. The ranks throw them away just before
they run step ``c+1``, and again whenever the run passes that step anew (a
later restart from an older checkpoint restores a data cursor from before
the skip). The uninterrupted reference run skips the same batches before
the same steps, so its final parameters are what the job should end with.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DataSkips:
    """Before which step how many batches are thrown away, on the run's present course."""

    before: dict[int, int] = field(default_factory=dict)

    def skip_after(self, restored: int, detected: int) -> int:
        """A rollback to the checkpoint of step ``restored`` from a detection at step ``detected``:
        the batches the abandoned steps drew are skipped before step ``restored + 1``; returns how
        many. Skips planned past ``restored`` belonged to the abandoned course and are folded in."""
        abandoned = {s: n for s, n in self.before.items() if s > restored}
        count = (detected - restored) + sum(n for s, n in abandoned.items() if s <= detected)
        self.before = {s: n for s, n in self.before.items() if s <= restored}
        self.before[restored + 1] = count
        return count

    def due(self, step: int) -> int:
        """How many batches to throw away before running ``step`` (0: none). Each run of a step starts
        from the data cursor of the end of the step before, which precedes the skip."""
        return self.before.get(step, 0)

    def total(self) -> int:
        """Every batch skipped on the run's course."""
        return sum(self.before.values())
