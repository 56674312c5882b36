"""A rank's endpoint on the fabric: what it shares between all its groups.

The data plane, the virtual clock, the topology, the timeouts, the link
faults in force, the links already set up, and what this rank saw of its
links and of the faults this step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from testbed.fabric.clock import RankClock
from testbed.fabric.dataplane import DataPlane
from testbed.fabric.linkfaults import LinkFaultTable
from testbed.topology.presets import Topology

#: The communication stack's version a rank reports at link setup (unless a fault changes it).
DEFAULT_VERSION = "HCCL 8.0.RC3"

Hook = Callable[[str], None]

#: How many collectives a rank records per step (``Endpoint.ops_run``); past it, only counted.
OPS_KEPT = 64


@dataclass(frozen=True)
class Received:
    """A message a collective received, as the payload hook sees it."""

    src: int
    #: the collective (``allreduce``, ...) and its half: ``reduce_scatter`` before its middle point,
    #: ``allgather`` after (a collective without a middle: ``reduce_scatter``)
    op: str
    half: str
    #: the modelled bytes it stands for, and its time on the link
    nbytes: float
    transfer_s: float


#: sees each array a collective receives and returns the array the collective goes on with
PayloadHook = Callable[[Received, np.ndarray], np.ndarray]


@dataclass
class Endpoint:
    """One rank's attachment to the fabric, shared by all of its groups."""

    rank: int
    dataplane: DataPlane
    clock: RankClock
    topology: Topology
    seed: int
    connect_timeout_s: float = 120.0
    exec_timeout_s: float = 1836.0
    faults: LinkFaultTable = field(default_factory=LinkFaultTable)
    version: str = DEFAULT_VERSION
    hook: Hook | None = None
    step: int = 0
    attempt: int = 0
    links_up: set[tuple[str, str, int, int]] = field(default_factory=set)
    #: the longest single link setup this rank made in this group epoch (virtual seconds)
    longest_setup_s: float = 0.0
    wait_by_op: dict[str, float] = field(default_factory=dict)
    algorithms_run: list[str] = field(default_factory=list)
    #: the collectives (and pipeline receives) of this step, the first ``OPS_KEPT``: ``[op, algo, group,
    #: bytes, t_start, t_end]`` (bytes as the modelled job moves them); ``ops_seen`` counts them all
    ops_run: list[list[Any]] = field(default_factory=list)
    ops_seen: int = 0
    #: each group sets up links as if this many times larger (a modelled job bigger than the cluster)
    setup_scale: float = 1.0
    #: per sender, what this rank saw of the link this step: [bytes, transfer s, rated s, wait s,
    #: rated latency s] and, once any message queued at this rank's ingress, the seconds queued
    link_obs: dict[int, list[float]] = field(default_factory=dict)
    #: per link fault id, how many messages and link set-ups it acted on at this rank (since last taken)
    fault_hits: dict[str, int] = field(default_factory=dict)
    #: a failure now ends in a job-wide abort (:func:`abort_job`) to every member of every group of
    #: this rank, so a failing collective sends no abort of its own: one marker per peer, not two
    job_abort_follows: bool = False
    #: the rank's view of each payload it receives (a silent corruption on a link, a checksum)
    on_payload: PayloadHook | None = None
    #: the state of this rank's links under netem (:mod:`testbed.collectives.netem_link`)
    netem: dict[Any, Any] = field(default_factory=dict)
    #: the group epoch this job started at: link set-up times are drawn for the job's epochs counted
    #: from it, so a fresh job run on later epochs (the reference run, the probe) draws a fresh job's
    first_epoch: int = 0

    def hit(self, kind: str, src: int, dst: int, t: float) -> None:
        """Count one message or set-up on ``src -> dst`` at ``t`` for each fault of ``kind`` in force."""
        for f in self.faults.on(kind, src, dst, t):
            self.fault_hits[f.fault_id] = self.fault_hits.get(f.fault_id, 0) + 1

    def record_op(self, op: str, algo: str, group: str, nbytes: float, t_start: float) -> list[Any] | None:
        """Note a collective beginning at ``t_start``; returns its record (its end set by the caller),
        or None past ``OPS_KEPT`` this step."""
        self.ops_seen += 1
        if self.ops_seen > OPS_KEPT:
            return None
        record = [op, algo, group, nbytes, t_start, t_start]
        self.ops_run.append(record)
        return record

    def ops_of_step(self, t_start: float) -> dict[str, Any]:
        """The step's collectives as ``step_end.ops`` holds them (begun at ``t_start``): times to the
        nanosecond and bytes whole, to keep a large world's journal small."""
        run = [
            [op, algo, group, round(n), round(a, 9), round(b, 9)] for op, algo, group, n, a, b in self.ops_run
        ]
        return {"t_start": round(t_start, 9), "run": run, "more": self.ops_seen - len(run)}

    def take_hits(self) -> dict[str, int]:
        """The link faults' hits since last taken (and start counting afresh)."""
        out, self.fault_hits = self.fault_hits, {}
        return out

    def observe(
        self,
        src: int,
        nbytes: float,
        transfer_s: float,
        wait_s: float,
        calls: float = 1.0,
        queued_s: float = 0.0,
    ) -> None:
        """Record one message from ``src``: how long it was on the link (from the sender's start of
        transmission to its arrival), how long the link's rated speed says, how long this rank waited
        (``calls``: the modelled job's messages it stands for, each paying the latency), and how long
        it queued at this rank's ingress behind other senders' bytes (counted apart from the link's
        own time)."""
        link = self.topology.link(src, self.rank)
        rated = link.latency_s * calls + nbytes / link.bandwidth_Bps
        obs = self.link_obs.setdefault(src, [0.0, 0.0, 0.0, 0.0, 0.0])
        obs[0] += nbytes
        obs[1] += transfer_s
        obs[2] += rated
        obs[3] += wait_s
        obs[4] += link.latency_s * calls
        if queued_s > 0.0:
            if len(obs) == 5:
                obs.append(0.0)
            obs[5] += queued_s

    def new_epoch(self, epoch: int, addresses: dict[int, tuple[Any, ...]]) -> None:
        """Forget every link: a new group epoch sets them all up again."""
        self.dataplane.new_epoch(epoch, addresses)
        self.links_up.clear()
        self.attempt = 0
        self.longest_setup_s = 0.0

    @property
    def job_epoch(self) -> int:
        """The group epoch counted from the job's first (what link set-up times are drawn for)."""
        return self.dataplane.epoch - self.first_epoch

    @property
    def job_tag(self) -> str:
        """The tag of a job-wide abort of the current attempt at a step (see :func:`abort_job`)."""
        return f"*{self.attempt}"

    def reported_version(self, rank: int) -> str:
        """The stack version ``rank`` reports now (a ``version_mismatch`` fault changes it)."""
        return self.faults.version_of(rank, self.clock.t, self.version)
