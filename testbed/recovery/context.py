"""What a recovery may see of a run and do to it: the narrow context the controller hands in.

A strategy reads the scenario, the cluster's actors and the journal, and the
run's recovery state (the learner, an elastic shrink in force, the replica
generations taken); it changes the run only through the methods below. The
controller is one such context (structurally: it is never imported here), so
a strategy can be tested against a small fake one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from testbed.actors.cluster import Cluster
    from testbed.core.journal import Journal
    from testbed.recovery.learned import Learner
    from testbed.recovery.record import Recovery, Shrunk
    from testbed.scenario.model import Scenario
    from testbed.train.replica_store import ReplicaGeneration


class Phase(Protocol):
    """The phase of training a failure happened in, as a recovery sees it."""

    @property
    def name(self) -> str:
        """``main``, ``reference`` or ``probe``."""

    @property
    def ckpt_root(self) -> Path | None:
        """Where the phase's checkpoints are (None: it writes none)."""

    #: restarts so far in this phase (a recovery counts its own against ``max_restarts``)
    restarts: int


class RecoveryContext(Protocol):
    """The run as a recovery strategy sees it."""

    @property
    def scenario(self) -> Scenario:
        """The scenario being run."""

    @property
    def cluster(self) -> Cluster:
        """The NPU and supervisor actors (replace a lost rank, call every rank)."""

    @property
    def journal(self) -> Journal:
        """The run's journal."""

    @property
    def learner(self) -> Learner | None:
        """The learned timeouts, when the policy learns them."""

    @property
    def step_t0(self) -> float | None:
        """When the step in flight began (virtual)."""

    @property
    def shrunk(self) -> Shrunk | None:
        """The elastic shrink in force, if any."""

    @property
    def replica_gens(self) -> list[ReplicaGeneration]:
        """The in-memory replica generations taken and still held."""

    @property
    def state_scale(self) -> float:
        """Modelled bytes of state per byte the numpy model holds."""

    @property
    def storage_Bps(self) -> float:
        """The shared storage's bandwidth now."""

    def now(self) -> float:
        """The virtual time at this step boundary."""

    def open_group(self, t0: float, cold: bool = True) -> float:
        """Open a new group epoch at ``t0``; returns when its links are up."""

    def active_ranks(self) -> list[int]:
        """The ranks training now."""

    def ranks_out(self) -> list[int]:
        """The ranks of data-parallel replicas an elastic job has out."""

    def resumed_from(self, manifest: dict[str, Any] | None) -> None:
        """The job restarted (from a checkpoint's manifest, or from memory)."""

    def forget_replicas_after(self, step: int) -> None:
        """Training goes back to ``step``: later replica generations describe a future that is redone."""

    def set_shrunk(self, shrunk: Shrunk | None) -> None:
        """An elastic shrink is in force (or over)."""

    def add_replica_generation(self, gen: ReplicaGeneration) -> None:
        """A replica generation was taken (the oldest beyond what ranks keep is forgotten)."""

    def set_clock(self, rank: int, t: float) -> None:
        """``rank``'s clock moved to ``t`` outside a step (a snapshot for a replica)."""

    def add_recovery(self, rec: Recovery) -> None:
        """A recovery was made (the controller completes it once the lost steps are recomputed)."""

    def detach_cut_off(self, step: int, out: dict[int, Any]) -> list[int]:
        """The ranks of ``out`` a partition keeps from the controller: given up (their processes run
        on) and recorded as lost, for the recovery to replace."""

    def reached(self, point: str) -> None:
        """The recovery reached ``point`` (``recovery.relinked``: restarted and linked, not yet
        loaded); a fault armed for that point acts there (a controller kill)."""

    def trusted_steps(self) -> set[int] | None:
        """The steps whose checkpoints a resume may load under ``policy.integrity``'s ``restore:
        verified`` (those a hash vouched for); None: any that verifies on disk."""
