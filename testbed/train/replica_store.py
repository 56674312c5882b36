"""In-memory replicas (Gemini-style): each rank's state also held by a peer in another supernode.

Every ``policy.checkpoint.replica_every`` steps each rank copies its whole
state (every checkpoint component) to host memory, charged ``bytes /
hbm_bandwidth`` on its clock, and sends that copy to its *holder*: the rank
with the same index in the next supernode. The transfer runs in the
background over the inter-supernode network (``bytes / inter bandwidth``,
Gemini interleaves it with training traffic), so a replica is usable only by
a failure after it arrived. Each rank keeps its own last two copies and the
last two it holds for its peer.

The bytes are real: they leave the rank's process through Ray and live in
the holder's process; a SIGKILL takes a rank's own copies and the copies it
held with it. Recovery (``policy.recovery.strategy: replica``) restores every
survivor from its own copy and every replaced rank from its holder; when a
holder died too, or no copy had arrived, it falls back to the newest
persistent checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from testbed.topology.presets import Topology

State = dict[str, dict[str, np.ndarray]]

#: Generations of copies a rank keeps (its own, and each it holds for a peer).
GENERATIONS = 2


def holder_of(rank: int, topology: Topology) -> int:
    """The rank that holds ``rank``'s replica: the same index in the next supernode (itself if only one)."""
    per = topology.npus_per_supernode
    return (rank + per) % topology.world


def state_bytes(state: State) -> int:
    """Bytes of a replica."""
    return sum(int(a.nbytes) for arrays in state.values() for a in arrays.values())


@dataclass
class ReplicaStore:
    """One NPU process's in-memory copies: its own state at recent steps, and the peers' it holds."""

    own: dict[int, State] = field(default_factory=dict)
    held: dict[tuple[int, int], State] = field(default_factory=dict)
    #: the main run's final state, kept to set beside the reference run's (RankState.keep_final)
    final: State | None = None

    def keep_own(self, step: int, state: State) -> None:
        """Keep this rank's copy of ``step`` (and the previous generation)."""
        self.own[step] = state
        for old in sorted(self.own)[:-GENERATIONS]:
            del self.own[old]

    def hold(self, rank: int, step: int, state: State) -> None:
        """Hold ``rank``'s copy of ``step`` (and its previous generation)."""
        self.held[(rank, step)] = state
        mine = sorted(s for r, s in self.held if r == rank)
        for old in mine[:-GENERATIONS]:
            del self.held[(rank, old)]

    def steps(self) -> dict[str, list[int]]:
        """Which steps this process has: its own, and per held rank."""
        held: dict[str, list[int]] = {}
        for r, s in sorted(self.held):
            held.setdefault(str(r), []).append(s)
        return {"own": sorted(self.own), **{f"held:{r}": v for r, v in held.items()}}


@dataclass(frozen=True)
class ReplicaGeneration:
    """One round of replicas as the controller saw it: the step, and when the last transfer arrived."""

    step: int
    t_ready: float
    bytes: int


def usable(generations: list[ReplicaGeneration], t_failure: float) -> list[ReplicaGeneration]:
    """The generations whose transfers had all arrived before ``t_failure``, newest first."""
    return sorted((g for g in generations if g.t_ready <= t_failure), key=lambda g: -g.step)
