"""What the parts of one run share: a phase's progress, and the run's state between steps.

The controller, the fault injection and the checkpoint commit each act on the
run; :class:`RunState` is what they share (the ranks' clocks at the last step
boundary, the link faults in force, the storage's bandwidth, pauses a fault
put on checkpoint writes), so none of them reaches into another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faults.kind import PlannedFault
from testbed.actors.cluster import Cluster
from testbed.control.controller_loss import ArmedKill
from testbed.fabric.linkfaults import LinkFaultTable
from testbed.recovery.record import Recovery
from testbed.scenario.preemption_section import PreemptionPolicy


@dataclass
class PhaseState:
    """Mutable state of one phase of training."""

    name: str
    faults: list[PlannedFault]
    ckpt_root: Path | None
    fired: set[str] = field(default_factory=set)
    recovering: Recovery | None = None
    restarts: int = 0
    warned_data: bool = False


@dataclass
class RunState:
    """The run between steps, as the controller, the faults and the checkpoint commit see it."""

    cluster: Cluster
    #: each rank's clock where its last step (or snapshot) left it
    clock_of: dict[int, float] = field(default_factory=dict)
    #: the link faults in force (pushed to every rank whenever they change)
    link_faults: LinkFaultTable = field(default_factory=LinkFaultTable)
    #: the share of the storage bandwidth left (an ``io_saturation`` fault cuts it)
    storage_factor: float = 1.0
    #: the checkpoint storage is full at a point of the commit, with an errno (None: it has room)
    commit_full: tuple[str, int] | None = None
    #: rank -> extra seconds its next checkpoint write takes (``checkpoint_pause``)
    ckpt_pause: dict[int, float] = field(default_factory=dict)
    #: rank -> the virtual time it may not start its next step before (a paused writer)
    held_until: dict[int, float] = field(default_factory=dict)
    #: where the main phase's checkpoints are
    ckpt_root: Path | None = None
    #: modelled bytes of state per byte the proxy holds (the workload's, or the job's: job_run)
    state_scale: float = 1.0
    #: the modelled job's checkpoint bytes by component (empty: no job section)
    job_checkpoint: dict[str, int] = field(default_factory=dict)
    #: the steps whose state a hash vouched for: retention keeps the newest checkpoint of one
    verified_steps: set[int] = field(default_factory=set)
    #: rank -> (the ``preempt`` fault armed on it, its window from SIGTERM to SIGKILL in seconds)
    preempt_armed: dict[int, tuple[str, float]] = field(default_factory=dict)
    #: ``policy.preemption`` (absent: the job has no handler, ``on_notice: none``)
    preemption: PreemptionPolicy = field(default_factory=lambda: PreemptionPolicy(on_notice="none"))
    #: rank -> the partition that keeps the controller from reaching it (``cuts_control``), its start
    cut_off: dict[int, tuple[str, float]] = field(default_factory=dict)
    #: rank -> its process the controller gave up while cut off, still running (a zombie): its record
    zombies: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: a ``controller_kill`` waiting for its point (None: the controller lives on)
    controller_kill: ArmedKill | None = None

    def now(self) -> float:
        """The virtual time at this step boundary: the earliest rank's clock."""
        return min(self.clock_of.values()) if self.clock_of else 0.0

    @property
    def storage_Bps(self) -> float:
        """The shared storage's bandwidth now (the preset's, cut by an ``io_saturation`` fault)."""
        return float(self.cluster.topology.preset.storage_Bps) * self.storage_factor

    def push_link_faults(self, table: LinkFaultTable) -> None:
        """Put ``table`` in force on every rank."""
        self.link_faults = table
        if self.cluster.npus:
            self.cluster.call_ok("set_link_faults", table)
