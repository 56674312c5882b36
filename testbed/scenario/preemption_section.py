"""``policy.preemption``: the notice a preemption comes with, and the limits under it.

A preemption (a spot instance reclaimed, a higher-priority job) arrives with
notice: AWS Spot gives 120 s, GCE Spot 30 s. The scheduler then sends SIGTERM
and, after its grace period, SIGKILL (Kubernetes' and Slurm's default grace:
30 s); the launcher waits its own timeout for the job to save and exit. An
emergency checkpoint must drain the step in flight and commit inside all of
them.

Without a ``policy.preemption`` section a job has no handler: a notice
changes nothing until the node is reclaimed (``on_notice: none``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from testbed.core.units import parse_duration
from testbed.scenario.fields import choice, integer, seconds

#: what a job does on its preemption notice (``policy.preemption.on_notice``)
ON_NOTICE = ("save", "abort", "none")


@dataclass(frozen=True)
class PreemptionPolicy:
    """``policy.preemption``: the ladder ``notice >= grace >= launcher timeout >= step + save``."""

    notice_s: float = seconds(30.0, 0.001, doc="the provider's notice before the node is reclaimed")
    grace_s: float = seconds(30.0, 0.001, doc="the scheduler's grace between SIGTERM and SIGKILL")
    launcher_timeout_s: float = seconds(
        30.0, 0.001, doc="how long the launcher waits for the job to save and exit after SIGTERM"
    )
    on_notice: str = choice(
        "save",
        lambda: ON_NOTICE,
        "on_notice",
        "save: finish the step in flight, agree on it, write an emergency checkpoint; abort: leave the "
        "step in flight and save the last finished one; none: nothing (the periodic checkpoint is all)",
    )
    no_progress_limit: int | None = integer(
        None,
        1,
        doc="end the run when this many preemptions in a row find the committed step where it was",
        optional=True,
    )

    def window(self, fault_params: Mapping[str, Any]) -> float:
        """A ``preempt`` entry's time from SIGTERM to SIGKILL: the smallest of its notice and grace
        (each, when the entry leaves it out, this section's) and the launcher's timeout."""

        def own(name: str, fallback: float) -> float:
            raw = fault_params.get(name)
            value = parse_duration(raw) if raw is not None else None
            return fallback if value is None else float(value)

        return min(own("notice_s", self.notice_s), own("grace_s", self.grace_s), self.launcher_timeout_s)
