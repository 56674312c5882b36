"""What faults do to one NPU from inside its process: knobs, pinned memory, armed deaths.

A mixin of :class:`testbed.train.npu.NPU`; every public method is one
control-plane call a fault kind makes through the controller's injector.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from testbed.collectives import Communicator, Endpoint
from testbed.core.errors import HarnessHang
from testbed.fabric.dataplane import DROP, DataPlane
from testbed.fabric.device_memory import Device, pin_pattern
from testbed.fabric.linkfaults import LinkFaultTable
from testbed.train.knobs import Knobs
from testbed.train.rank_spec import RankSpec


class RankFaults:
    """The fault surface of an NPU: what a fault kind may set, pin, arm or cut on this rank."""

    rank: int
    spec: RankSpec
    supervisor: Any
    ep: Endpoint
    dataplane: DataPlane
    device: Device
    knobs: Knobs
    groups: dict[str, Communicator]
    _pins: dict[str, list[tuple[str, int]]]
    _kill_at: tuple[int, str] | None
    _action: str
    #: anchored link faults this rank started, and when (kept across table updates; reset clears it)
    link_anchors: dict[str, float]
    _anchors_new: dict[str, float]
    _anchor_points: set[tuple[int, str]]
    _preempt_hook: Callable[[str], None]  # RankPreemption's

    def set_knob(self, name: str, value: Any) -> None:
        """Set one of this rank's fault knobs (:mod:`testbed.train.knobs`)."""
        self.knobs.set(name, value)

    def fragment(self, fault_id: str, block: int, count: int, spacing: int) -> dict[str, Any]:
        """Pin ``count`` blocks of ``block`` bytes with ``spacing``-byte holes between them (a fault)."""
        pinned, why = pin_pattern(self.device, fault_id, block, count, spacing)
        stopped = {"stopped": why} if why else {}  # the device filled up: what fitted stays pinned
        self._pins[fault_id] = pinned
        clock = self.ep.clock
        clock.advance_to(clock.t + self.device.charge())
        return {"pinned": len(pinned), **stopped, **self.device.stats()}

    def release(self, fault_id: str) -> None:
        """Free what :meth:`fragment` pinned (nothing if a restart already dropped it)."""
        for placed in self._pins.pop(fault_id, []):
            self.device.free(placed)

    def mark_dead(self, rank: int, address: Sequence[Any] | None = None) -> None:
        """``rank``'s process (listening at ``address``) died: stop waiting for it (called while a step
        is in flight)."""
        self.dataplane.mark_dead(rank, address)

    def set_link_faults(self, table: LinkFaultTable) -> None:
        """Replace the link faults in force (a record anchored to a point this rank already passed keeps
        the start this rank gave it)."""
        for fault_id, t in self.link_anchors.items():
            table, _ = table.resolved(lambda f, fid=fault_id: f.fault_id == fid, t)  # type: ignore[misc]
        self.ep.faults = table
        self._anchor_points = table.anchors()

    def _start_anchored(self, point: str) -> None:
        """Start the link faults anchored to ``point`` of this step at this rank's clock."""
        if (self.ep.step, point) not in self._anchor_points:
            return
        t = self.ep.clock.t
        self.ep.faults, started = self.ep.faults.anchored_at(self.ep.step, point, t)
        self._anchor_points = self.ep.faults.anchors()
        for fault_id in started:
            self.link_anchors[fault_id] = t
            self._anchors_new[fault_id] = t

    def take_anchors(self) -> dict[str, float]:
        """The anchored link faults this rank started since last asked, and when (for the controller,
        which heals them once their windows have passed)."""
        out, self._anchors_new = self._anchors_new, {}
        return out

    def arm_kill(self, step: int, point: str, action: str = "kill") -> None:
        """When ``point`` of ``step`` is reached, have this supernode's supervisor SIGKILL this process
        (``kill``) or freeze it with SIGSTOP (``hang``)."""
        self._kill_at = (step, point)
        self._action = action

    def _hook(self, point: str) -> None:
        """Called at each named point of a step: start the link faults anchored to it, carry out the
        death armed for it, if any."""
        self._start_anchored(point)
        self._preempt_hook(point)
        if self._kill_at != (self.ep.step, point):
            return
        self._kill_at = None
        self.dataplane.flush()  # what the model says was sent is on the wire before death
        if self._action == "hang":
            self._leave_no_answer()
        self.supervisor.signal(self._action, self.rank, self.ep.clock.t, self.ep.step, point)
        time.sleep(self.spec.guard_s)
        raise HarnessHang(f"rank {self.rank}: still running after its supervisor's signal", rank=self.rank)

    def _leave_no_answer(self) -> None:
        """Before freezing: a marker to every peer, so that a wait on this rank ends at its modelled
        exec timeout (``wait_start + exec_s``, a true timeout) instead of in wall time, as a dropped
        message's marker does. A frozen process sends nothing else."""
        why = f"rank {self.rank} stopped answering (hung since virtual t={self.ep.clock.t:.6f} s)"
        peers = sorted({r for g in self.groups.values() for r in g.ranks} - {self.rank})
        self.dataplane.send_markers(peers, DROP, {"tag": self.ep.job_tag, "t": self.ep.clock.t, "why": why})
        self.dataplane.flush()
