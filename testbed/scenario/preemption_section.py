"""``policy.preemption``: the notice a preemption comes with, and the limits under it.

A preemption (a spot instance reclaimed, a higher-priority job) arrives with
notice: AWS Spot gives 120 s, GCE Spot 30 s. The scheduler then sends SIGTERM
and, after its grace period, SIGKILL (Kubernetes' and Slurm's default grace:
30 s); the launcher waits its own timeout for the job to save and exit. An
emergency checkpoint must drain the step in flight and commit inside all of
them.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.scenario.fields import seconds


@dataclass(frozen=True)
class PreemptionPolicy:
    """``policy.preemption``: the ladder ``notice >= grace >= launcher timeout >= step + save``."""

    notice_s: float = seconds(30.0, 0.001, doc="the provider's notice before the node is reclaimed")
    grace_s: float = seconds(30.0, 0.001, doc="the scheduler's grace between SIGTERM and SIGKILL")
    launcher_timeout_s: float = seconds(
        30.0, 0.001, doc="how long the launcher waits for the job to save and exit after SIGTERM"
    )
