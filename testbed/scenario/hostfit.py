"""Whether a scenario fits the machine that runs it: host memory, estimated before anything starts.

Two questions, asked at two moments:

- at validation, whether *one* NPU process of the scenario could hold its
  workload (model, optimizer state, data set) in this machine's memory at
  all: :func:`rank_problems` (a model of a billion-wide layer, a data set of
  a trillion samples). Such a scenario runs nowhere here, on any cluster.
- before a run starts its own Ray (no ``--address``), whether this machine
  can hold *every* process of the cluster at once: :func:`refuse_unless_local_fits`.
  A 64 x 384 cluster is a fine scenario for a Ray cluster of many hosts, and
  far beyond one.

The figures per process are measured, not guessed (``python -m
testbed.experiments.scale``, docs/scale.md, on a 2-core 24 GiB machine): an
NPU process forked by its supernode's NPU host costs about 7 MiB PSS at
rest; over a whole run (its sockets, buffers, the pages it comes to write)
each added NPU took 18 to 20 MiB of system memory, its supernode's share
included. The estimate keeps a margin: 20 MB per NPU process, 100 MB per
supernode (its Ray actor and its NPU host), 0.3 GB for Ray and the driver.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psutil

from testbed.core.errors import ScenarioError
from testbed.core.units import format_bytes

#: System memory one NPU process costs in a whole run (measured, docs/scale.md).
PROCESS_BYTES = 20 * 10**6
#: System memory one supernode costs: its Ray actor and its NPU host (measured, docs/scale.md).
SUPERNODE_BYTES = 100 * 10**6
#: Ray's daemons and the driver (measured, docs/scale.md).
BASE_BYTES = 300 * 10**6


@dataclass(frozen=True)
class HostMemory:
    """This machine's memory: all of it, and what is available now."""

    total: int
    available: int

    @classmethod
    def now(cls) -> HostMemory:
        """Read from the operating system."""
        vm = psutil.virtual_memory()
        return cls(total=int(vm.total), available=int(vm.available))


def workload_bytes(name: str, options: Mapping[str, Any], layout: Any) -> int:
    """What one NPU process of workload ``name`` holds in host memory (the workload's own estimate)."""
    from workloads import WORKLOADS

    info = WORKLOADS[name]
    return 0 if info.host_bytes is None else int(info.host_bytes({**info.options, **options}, layout))


def rank_problems(name: str, options: Mapping[str, Any], layout: Any, host: HostMemory) -> list[str]:
    """Why one NPU process of the workload cannot fit this machine's memory (empty when it can)."""
    need = workload_bytes(name, options, layout)
    if need + PROCESS_BYTES <= host.total:
        return []
    return [
        f"one NPU process would hold about {format_bytes(need)} (model, optimizer state and data set), more "
        f"than this machine's {format_bytes(host.total)} of memory; make the model or the data set smaller "
        "(hidden, layers, samples, ...): the numpy model stands for the job, it need not be its size"
    ]


@dataclass(frozen=True)
class LocalEstimate:
    """The system memory a local run needs, and how it was reckoned."""

    npus: int
    per_npu: int
    supervisors: int
    total: int

    @classmethod
    def of(cls, supernodes: int, npus: int, workload: int) -> LocalEstimate:
        """``npus`` NPU processes (hot spares included) holding ``workload`` bytes each, a supervisor
        per supernode, Ray, and the driver's own copy of the workload (it probes the model)."""
        per_npu = PROCESS_BYTES + workload
        total = BASE_BYTES + workload + npus * per_npu + supernodes * SUPERNODE_BYTES
        return cls(npus=npus, per_npu=per_npu, supervisors=supernodes, total=total)

    def describe(self) -> str:
        """``N NPU processes x M + S supernodes x P + Ray's base = T``."""
        return (
            f"{self.npus:,} NPU processes x {format_bytes(self.per_npu)} + {self.supervisors} supernodes "
            f"x {format_bytes(SUPERNODE_BYTES)} + {format_bytes(BASE_BYTES)} for Ray = "
            f"{format_bytes(self.total)}"
        )


def refuse_unless_local_fits(need: LocalEstimate, what: str, host: HostMemory | None = None) -> None:
    """Raise :class:`ScenarioError` when this machine cannot hold a local run that needs ``need``
    (``what``: the scenario, as the message names it)."""
    host = host or HostMemory.now()
    if need.total <= host.available:
        return
    raise ScenarioError(
        f"{what}: cluster: a local run needs about {need.describe()} of memory (measured per process), "
        f"and this machine has {format_bytes(host.available)} available of {format_bytes(host.total)}; "
        "nothing was started. Run it on a Ray cluster with --address HOST:PORT, or make the cluster smaller",
        need=need.total,
        available=host.available,
    )
