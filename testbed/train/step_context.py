"""What a workload sees of the engine during a step: its groups, its clock, its device's operators.

A rank joins one communicator per parallel axis (``tp``, ``pp``, ``ep``,
``dp``) and two derived ones: ``replica`` (``dp x ep``: the dense layers'
gradient average) and ``model`` (``tp x ep x pp`` at one DP index: the
global gradient norm). Group names are the same on every member, so their
tags and link-setup keys agree; a group over the whole world is ``world``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from testbed.collectives import Communicator, Endpoint, Modelled
from testbed.core.errors import UnsupportedOperator
from testbed.fabric.clock import RankClock
from testbed.job.pipeline import PipelineWaits, due_s
from testbed.topology.layout import Layout

#: The operators the workloads ask their device for (what ``unsupported_op`` can take away).
OPERATORS = ("matmul", "layer_norm", "gelu", "dropout", "softmax", "alltoall")

#: Each group a rank joins, and the axes its members differ along.
GROUP_AXES: dict[str, tuple[str, ...]] = {
    "tp": ("tp",),
    "pp": ("pp",),
    "ep": ("ep",),
    "dp": ("dp",),
    "replica": ("dp", "ep"),
    "model": ("tp", "ep", "pp"),
}


def open_groups(
    ep: Endpoint, layout: Layout, dp_active: frozenset[int] | None = None
) -> dict[str, Communicator]:
    """This rank's communicator on every axis of ``layout``, and ``world``.

    Axes with the same members share one communicator (one sequence of tags).
    With ``dp_active`` (an elastic job that dropped data-parallel replicas)
    only ranks whose DP index is in it are members.
    """

    def active(rank: int) -> bool:
        return dp_active is None or layout.coords(rank).dp in dp_active

    world = Communicator(ep, "world", [r for r in range(layout.world) if active(r)])
    by_members: dict[tuple[int, ...], Communicator] = {tuple(world.ranks): world}
    groups: dict[str, Communicator] = {"world": world}
    for name, axes in GROUP_AXES.items():
        members = tuple(r for r in layout.group(ep.rank, axes) if active(r))
        if members not in by_members:
            by_members[members] = Communicator(ep, f"{name}@{members[0]}", list(members))
        groups[name] = by_members[members]
    return groups


@dataclass
class StepContext:
    """One rank's view of the step in progress."""

    rank: int
    step: int
    layout: Layout
    groups: dict[str, Communicator]
    clock: RankClock
    peak_flops: float
    efficiency: float
    sync_algo: dict[str, str] = field(default_factory=dict)
    missing_ops: frozenset[str] = frozenset()
    scale: float = 1.0
    #: by the group a collective runs in: (the job's latency seconds per call of the proxy's, the
    #: job's bandwidth seconds per byte of the proxy's, the bytes of one of the job's calls, the
    #: ranks of the job's group)
    job_scale: dict[str, tuple[float, float, int, int]] = field(default_factory=dict)
    slowdown: float = 1.0
    flops: float = 0.0
    #: the modelled job's pipeline waits for this rank's stage (None: the proxy's own schedule times it)
    pipeline: PipelineWaits | None = None
    #: of them, the seconds already waited this step
    pipeline_waited: float = 0.0
    #: told when the step reaches a point (``backward``) where an armed fault may act
    hook: Callable[[str], None] | None = None
    #: shown each value the step makes as it is made, which it may change (a silent corruption)
    made: Callable[[str, str, np.ndarray], np.ndarray] | None = None

    def enter(self, point: str) -> None:
        """The step reaches ``point``: let an armed fault act (a kill or a freeze)."""
        if self.hook is not None:
            self.hook(point)

    def output(self, kind: str, name: str, value: np.ndarray) -> np.ndarray:
        """The value to go on with: ``value``, made by ``name`` (``kind``: ``forward`` for a layer's
        output, ``backward`` for the gradient it hands back, ``index`` for the sample indices of
        the batch), unless a silent corruption of this rank's compute changed it."""
        return value if self.made is None else self.made(kind, name, value)

    def compute(self, flops: float) -> None:
        """Charge ``flops`` (times the modelled job's ``scale``) to this rank's clock.

        ``T += flops / (peak_flops * efficiency) * slowdown``; a straggler has ``slowdown`` above 1.
        """
        self.flops += flops * self.scale
        self.clock.compute(flops * self.scale, self.peak_flops, self.efficiency, self.slowdown)

    def modelled(self, group: str, nbytes: int) -> Modelled | None:
        """What the proxy's collective of ``nbytes`` in ``group`` stands for in the modelled job, or
        None (itself) when there is no job or it sets nothing for that group."""
        scale = self.job_scale.get(group)
        return None if scale is None else Modelled(scale[0], scale[1] * nbytes, scale[2], scale[3])

    def send(self, group: str, dst: int, arr: np.ndarray) -> None:
        """Send ``arr`` to ``dst`` of the pipeline's ``group``: as the modelled job's message, and with a
        job, untimed (the receiver waits the job's schedule instead, :mod:`testbed.job.pipeline`)."""
        modelled = self.modelled(group, arr.nbytes)
        self.groups[group].send_to(dst, arr, modelled, timed=self.pipeline is None)

    def recv(self, group: str, src: int) -> np.ndarray:
        """The next array ``src`` sent in ``group``; with a job, then the job's pipeline waits due by now."""
        arr = self.groups[group].recv_from(src)
        self._pipeline_wait(group, end=False)
        return arr

    def pipeline_done(self) -> None:
        """The step's pipeline is over on this rank: wait whatever of the job's pipeline waits is left
        (its cool-down). Nothing without a job, or without a pipeline."""
        self._pipeline_wait("pp", end=True)

    def _pipeline_wait(self, group: str, end: bool) -> None:
        if self.pipeline is None:
            return
        dt = due_s(self.pipeline, self.flops, self.pipeline_waited, end)
        if dt <= 0:
            return
        self.pipeline_waited += dt
        wait = self.clock.receive(self.clock.t + dt)  # a wait in the pipeline's receives: its bubble
        ep = self.groups[group].ep
        ep.wait_by_op["recv"] = ep.wait_by_op.get("recv", 0.0) + wait

    def use(self, op: str, where: str) -> None:
        """About to run operator ``op`` in ``where``: fail now if this device lacks it."""
        if op in self.missing_ops:
            raise UnsupportedOperator(
                f"rank {self.rank}: operator '{op}' is not supported by this device's software stack "
                f"(first use: {where}, step {self.step}); install the same CANN/driver version on every "
                "node, or replace the operator in the model",
                rank=self.rank,
                op=op,
                layer=where,
                step=self.step,
                t=self.clock.t,
                wait_start=self.clock.t,
                how="direct",
            )

    def algo(self, group: str) -> str:
        """The algorithm the gradient synchronisation uses in ``group`` (``auto`` if not chosen)."""
        return self.sync_algo.get(group, "auto")
