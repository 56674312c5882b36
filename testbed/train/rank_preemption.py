"""A preemption as one NPU's process meets it: a real SIGTERM, its handler, and the SIGKILL after grace.

The process's SIGTERM handler only counts the signal, as Megatron's
exit-signal handler only sets a flag: the rank reads it at the named points
of its step. A ``preempt`` fault arms a rank with a point; there the rank
asks its supernode for the signal (``os.kill(pid, SIGTERM)``), waits (within
its guard) until its own handler has run, and takes the notice at its
virtual clock, so that the same seed gives the same notice time. From then:

- its deadline is the notice plus the window (the smallest of the notice,
  the scheduler's grace and the launcher's timeout): at the first point at or
  past it, the rank has its supernode SIGKILL it, journalled at the deadline
  (point ``grace_end``), as the scheduler's SIGKILL would;
- under ``on_notice: abort`` it leaves the step in flight at its next point
  inside the step (:class:`~testbed.core.errors.Preempted`);
- :meth:`RankPreemption.agree_to_stop` is the job's check after a step: an
  allreduce (max) of [got SIGTERM, step] over every rank, as Megatron
  all-reduces its flag, so that every rank stops at, and saves, one step.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import numpy as np

from testbed.collectives import Communicator, Endpoint
from testbed.collectives.select import MESH_MAX
from testbed.core.errors import HarnessHang, Preempted
from testbed.fabric.dataplane import DataPlane
from testbed.fabric.device_memory import Device
from testbed.train.rank_spec import RankSpec

#: how many SIGTERMs this process has received (the handler's one job is to count them)
_TERMS = [0]

#: the points of a step at which a rank under ``on_notice: abort`` leaves it (inside the step's abort
#: scope, so that every peer hears of it; not the boundary before it, nor a checkpoint's write)
ABORTS_AT = frozenset({"forward", "backward", "grad_sync", "allreduce.mid"})


def _on_term(signum: int, frame: FrameType | None) -> None:
    _TERMS[0] += 1


def install_term_handler() -> None:
    """Make this process count SIGTERMs instead of dying of them (a job's preemption handler)."""
    signal.signal(signal.SIGTERM, _on_term)


def terms_received() -> int:
    """The SIGTERMs this process has received so far."""
    return _TERMS[0]


@dataclass
class Notice:
    """One rank's preemption: armed for a point, then noticed, with the deadline that follows."""

    #: the SIGTERMs this process had received when it was made (a notice is one more than this)
    base: int = 0
    #: (step, point) at which the rank asks for its SIGTERM
    armed: tuple[int, str] | None = None
    #: seconds from the notice to the SIGKILL
    window_s: float = 30.0
    on_notice: str = "none"
    #: when the notice came (virtual), once the handler ran
    t: float | None = None
    deadline: float | None = None
    aborted: bool = False


class RankPreemption:
    """The preemption surface of an NPU: armed notices, their deadline, the agreement on a step."""

    rank: int
    spec: RankSpec
    supervisor: Any
    ep: Endpoint
    dataplane: DataPlane
    groups: dict[str, Communicator]
    sync_algo: dict[str, str]
    notice: Notice

    workload: Any
    device: Device
    _snapshot: tuple[int, dict[str, dict[str, np.ndarray]]] | None
    _placed: tuple[tuple[str, int], ...]
    _pending: Any

    _group: Callable[[], Communicator]  # RankState's

    def arm_preempt(self, step: int, point: str, window_s: float, on_notice: str) -> None:
        """Ask for a SIGTERM at ``point`` of ``step``; SIGKILL ``window_s`` after it (virtual). A rank
        noticed already keeps its notice and deadline: a second SIGTERM may bring the SIGKILL forward,
        never push it back."""
        old = self.notice
        self.notice = Notice(
            terms_received(), (step, point), window_s, on_notice, old.t, old.deadline, old.aborted
        )

    def _take_armed(self, point: str) -> None:
        """At a named point: if a notice is armed for it, get the SIGTERM now and start the window."""
        n, t, step = self.notice, self.ep.clock.t, self.ep.step
        if n.armed == (step, point):
            n.armed = None
            self.supervisor.signal("term", self.rank, t, step, point)
            self._await_handler()
            n.t = t if n.t is None else n.t
            n.deadline = t + n.window_s if n.deadline is None else min(n.deadline, t + n.window_s)

    def _preempt_hook(self, point: str) -> None:
        """At a named point: take an armed notice, die at a deadline passed, leave a step to abort."""
        self._take_armed(point)
        n, t, step = self.notice, self.ep.clock.t, self.ep.step
        if n.deadline is not None and t >= n.deadline:  # the grace ran out: the scheduler's SIGKILL
            self.dataplane.flush()
            self.supervisor.signal("kill", self.rank, n.deadline, step, "grace_end")
            time.sleep(self.spec.guard_s)
            raise HarnessHang(f"rank {self.rank}: still running after its grace's SIGKILL", rank=self.rank)
        if n.t is not None and n.on_notice == "abort" and point in ABORTS_AT and not n.aborted:
            n.aborted = True
            raise Preempted(
                f"rank {self.rank}: preempted (SIGTERM at virtual t={n.t:.3f} s); it leaves step {step} "
                "(policy.preemption.on_notice: abort)",
                rank=self.rank,
                step=step,
                t=t,
                t_notice=n.t,
                preempted=True,
                how="direct",
            )

    def _await_handler(self) -> None:
        """Wait (within the guard) until this process's SIGTERM handler has run."""
        guard = time.monotonic() + self.spec.guard_s
        while terms_received() <= self.notice.base:
            if time.monotonic() > guard:
                raise HarnessHang(
                    f"rank {self.rank}: its SIGTERM handler did not run within {self.spec.guard_s:g} s",
                    rank=self.rank,
                )
            time.sleep(0.001)

    def noticed(self) -> bool:
        """Whether this process has received a SIGTERM since it was (re)started: its handler's flag."""
        return terms_received() > self.notice.base

    def agree_to_stop(self, step: int) -> dict[str, Any]:
        """Every rank's [got SIGTERM, step], reduced by max over the world (in a large world: over the
        model-parallel group, then over the replicas, which together span it): whether to stop, and
        the one step all ranks save."""
        flags = np.array([float(self.noticed()), float(step)])
        world = self._group()
        if world.size <= MESH_MAX:
            flags = world.allreduce(flags, op="max")
        else:
            for name in ("model", "replica"):
                flags = self.groups[name].allreduce(flags, op="max", algo=self.sync_algo.get(name, "auto"))
        return {
            "stop": bool(flags[0]),
            "step": int(flags[1]),
            "noticed": self.noticed(),
            "t": self.ep.clock.t,
        }

    def back_to_step_start(self, step: int) -> float:
        """After an aborted ``step``: the state it started from again (its in-memory snapshot, when the
        rank had begun it); returns this rank's clock."""
        if self._snapshot is not None and self._snapshot[0] == step:
            for component, arrays in self._snapshot[1].items():
                self.workload.load(component, arrays)
        for placed in self._placed:  # the aborted attempt's device buffers
            self.device.free(placed)
        self._placed, self._pending = (), None
        return self.ep.clock.t
