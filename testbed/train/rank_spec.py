"""What every NPU is told at start: the rank's specification, identical for every rank."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from testbed.core.secret import RunSecret
from testbed.job.spec import Job
from testbed.topology.layout import Layout
from testbed.topology.presets import Topology


@dataclass(frozen=True)
class RankSpec:
    """Everything an NPU needs to know at start, identical for every rank."""

    topology: Topology
    seed: int
    #: makes the rank's workload from (options, seed, rank, layout): a class of :mod:`workloads`,
    #: handed in (pickled by reference) so that the NPU never looks the workload up by name
    workload_factory: Callable[..., Any]
    workload_options: dict[str, Any]
    connect_timeout_s: float
    exec_timeout_s: float
    algorithm: str = "auto"
    warmup: bool = True
    guard_s: float = 60.0
    host: str = "127.0.0.1"
    socket_dir: str | None = None
    device_bytes: int = 64 * 2**20
    memory_policy: str = "none"
    pool_share: float = 0.25
    layout: Layout | None = None
    compute_scale: float = 1.0
    #: every collective payload's end-to-end checksum is checked (``policy.integrity.checksums``)
    payload_checksums: bool = False
    state_scale: float = 1.0  # modelled bytes of state per byte held (snapshot times only)
    #: the modelled job (None: the scales above instead): each NPU derives its scales from it
    job: Job | None = None
    step_snapshot: bool = False  # keep each step's starting state in memory (for step retry)
    setup_scale: float = 1.0  # groups set links up as if this many times larger (cluster.modelled_npus)
    #: the run's secret: every listener of the run asks a peer to prove it holds it. A new spec gets
    #: a fresh one; copies (dataclasses.replace, pickling through Ray) keep it. Its repr hides it.
    secret: RunSecret = field(default_factory=RunSecret.new)

    def parallel(self) -> Layout:
        """The parallel layout (all data-parallel unless given)."""
        return self.layout or Layout(dp=self.topology.world)

    def make_workload(self, rank: int) -> Any:
        """A fresh workload for ``rank``: its initial state, as a newly started process has it."""
        return self.workload_factory(self.workload_options, self.seed, rank, self.parallel())
