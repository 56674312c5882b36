"""Fault injection: what a fault kind may do to the running cluster, and when each fault fires and heals.

:class:`ClusterInjector` is the :class:`faults.kind.Injector` a fault kind
acts through: a real SIGKILL or SIGSTOP through a supernode's supervisor, a
Ray node taken down, link-fault records put in force on every rank, knobs set
on the NPUs (slowdown, input delay, full storage, missing operators, pinned
memory), bytes flipped in a committed checkpoint. :class:`FaultSchedule`
fires the plan's faults at their step boundaries (or right after the commit
of the checkpoint they act on), the arrivals of Poisson processes, and heals
what has run its course, journalling each.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from faults.arrivals import Arrivals
from faults.kind import AFTER_COMMIT, PlannedFault, kinds
from faults.triggers import due
from testbed.control.controller_loss import ArmedKill, die_if_armed
from testbed.control.partitioned import zombies_return
from testbed.control.state import PhaseState, RunState
from testbed.core.journal import Journal
from testbed.fabric.linkfaults import LinkFault, LinkFaultTable
from testbed.train import checkpoint as ckpt


class ClusterInjector:
    """The injector fault kinds act through, on the cluster and the run's shared state."""

    def __init__(self, state: RunState, journal: Journal) -> None:
        self.state = state
        self.cluster = state.cluster
        self.journal = journal

    def cut_control(self, fault_id: str, ranks: list[int], t0: float) -> None:
        """From ``t0`` the controller cannot reach ``ranks`` (a partition that severs the control
        network): a failure declares them lost and leaves their processes running."""
        self.state.cut_off.update({r: (fault_id, t0) for r in ranks})

    def zombies_return(self, fault_id: str) -> None:
        """``fault_id`` healed: the ranks it cut off are reachable again, and its zombies act."""
        zombies_return(self.state, self.journal, fault_id, self.now())

    def kill_now(self, rank: int, step: int) -> dict[str, Any]:
        """SIGKILL ``rank`` between steps (its clock is where its last step left it)."""
        return self.cluster.kill(rank, self.state.clock_of.get(rank, 0.0), step, "boundary")

    def arm_kill(self, rank: int, step: int, point: str) -> None:
        """Arm ``rank`` to be SIGKILLed at ``point`` of ``step``."""
        self.cluster.call_ok("arm_kill", step, point, ranks=[rank])

    def arm_hang(self, rank: int, step: int, point: str) -> None:
        """Arm ``rank`` to freeze (SIGSTOP) at ``point`` of ``step``; calls stop waiting for it then."""
        self.cluster.call_ok("arm_kill", step, point, "hang", ranks=[rank])

    def arm_preempt(
        self, fault_id: str, ranks: list[int], step: int, point: str, windows: dict[str, Any]
    ) -> dict[str, Any]:
        """Arm ``ranks`` to get their SIGTERM at ``point`` of ``step``; their window to SIGKILL is the
        smallest of the notice, the grace (the fault's, else the policy's) and the launcher's timeout."""
        policy = self.state.preemption
        window = policy.window(windows)
        self.cluster.call_ok("arm_preempt", step, point, window, policy.on_notice, ranks=ranks)
        self.state.preempt_armed.update({r: (fault_id, window) for r in ranks})
        return {"armed": point, "ranks": ranks, "window_s": window, "on_notice": policy.on_notice}

    def pause_checkpoint(self, rank: int, seconds: float) -> None:
        """Make ``rank``'s write of the next checkpoint take ``seconds`` longer."""
        self.state.ckpt_pause[rank] = self.state.ckpt_pause.get(rank, 0.0) + seconds

    def lose_ray_node(self, supernode: int, step: int) -> dict[str, Any]:
        """Take down the Ray node of ``supernode`` between steps (its NPUs' clocks are where they were)."""
        ranks = self.cluster.topology.ranks_of(supernode)
        t = min(self.state.clock_of.get(r, 0.0) for r in ranks)
        return self.cluster.lose_node(supernode, t, step)

    def now(self) -> float:
        """The virtual time at this step boundary: the earliest rank's clock."""
        return self.state.now()

    def add_link_faults(self, records: list[LinkFault]) -> None:
        """Put link-fault records in force on every rank."""
        self.state.push_link_faults(self.state.link_faults.plus(records))

    def remove_link_faults(self, fault_id: str) -> None:
        """Lift every link-fault record of ``fault_id``."""
        self.state.push_link_faults(self.state.link_faults.without(fault_id))

    def fragment_memory(
        self, ranks: list[int], fault_id: str, block: int, count: int, spacing: int
    ) -> dict[str, Any]:
        """Pin a pattern of blocks in the device memory of ``ranks``; returns each rank's stats after."""
        done = self.cluster.call_ok("fragment", fault_id, block, count, spacing, ranks=ranks)
        return {str(r): v for r, v in done.items()}

    def release_memory(self, ranks: list[int], fault_id: str) -> None:
        """Free the blocks ``fault_id`` pinned."""
        self.cluster.call_ok("release", fault_id, ranks=ranks)

    def set_knob(self, ranks: list[int] | None, name: str, value: Any) -> None:
        """Set a fault knob (:mod:`testbed.train.knobs`) on ``ranks`` (None: every rank)."""
        self.cluster.call_ok("set_knob", name, value, ranks=ranks)

    def fill_storage(self, point: str | None, code: int = 28) -> None:
        """Make the checkpoint storage full at ``point`` of every save (None: room again): a shard's
        point on every rank, a commit's point in the controller's commit."""
        shard = point is not None and point.startswith("shard")
        self.set_knob(None, "disk_full", f"{point}:{code}" if shard else "")
        self.state.commit_full = (point, code) if point is not None and not shard else None

    def arm_controller_kill(self, fault_id: str, point: str, torn: bool) -> None:
        """SIGKILL the controller's process when it reaches ``point`` (``torn``: mid-journal-line)."""
        self.state.controller_kill = ArmedKill(fault_id, point, torn)

    def set_storage_bandwidth(self, factor: float) -> None:
        """Scale the storage bandwidth by ``factor`` (1 restores it)."""
        self.state.storage_factor = factor

    def corrupt_checkpoint(self, step: int, rank: int, component: str) -> dict[str, Any]:
        """Flip 8 bytes in the middle of ``rank``'s ``component`` file of the checkpoint of ``step``."""
        assert self.state.ckpt_root is not None
        path = ckpt.step_dir(self.state.ckpt_root, step) / f"rank_{rank:05d}" / f"{component}.npz"
        if not path.is_file():
            return {"path": str(path), "corrupted": False, "why": "no such committed file"}
        data = bytearray(path.read_bytes())
        offset = len(data) // 2
        data[offset : offset + 8] = bytes(b ^ 0xFF for b in data[offset : offset + 8])
        path.write_bytes(bytes(data))
        return {"path": str(path), "corrupted": True, "offset": offset, "bytes": 8}


class FaultSchedule:
    """Fires the plan's faults and the Poisson arrivals, and heals those whose time is up."""

    def __init__(self, injector: ClusterInjector, journal: Journal) -> None:
        self.injector = injector
        self.journal = journal
        self.to_heal: dict[str, tuple[PlannedFault, float | None, int | None]] = {}
        #: faults anchored to a point of a step: their window's length, until the ranks start them
        self.anchored: dict[str, tuple[PlannedFault, float]] = {}
        self.arrivals: list[Arrivals] = []  # Poisson fault processes (main phase only)

    def inject_due(self, phase: PhaseState, step: int, committed: bool = False) -> None:
        """Inject the faults due at the boundary before ``step``, or (``committed``) those that act on
        the checkpoint of ``step`` just committed."""
        registry = kinds()
        for fault in phase.faults:
            if (fault.point == AFTER_COMMIT) != committed:
                continue
            if due(fault, step, self.injector.now) and fault.id not in phase.fired:
                phase.fired.add(fault.id)
                fault = dataclasses.replace(fault, step=step)  # a timed fault acts at this boundary
                with self.journal.bound(fault=fault.id):
                    record = registry[fault.kind].inject(self.injector, fault)
                    self.journal.emit("fault_injected", phase=phase.name, **fault.as_dict(), record=record)
                self.keep_until_healed(fault, record)
        if not committed:  # a controller kill at this boundary comes once its injection is journalled
            die_if_armed(
                self.injector.state.controller_kill,
                self.journal,
                "step.start",
                self.injector.now(),
                step=step,
            )

    def keep_until_healed(self, fault: PlannedFault, record: dict[str, Any]) -> None:
        """Heal ``fault`` when what it journalled (``record``) says: at a window's end (virtual), after
        a span of steps, or ``length_s`` after the last rank started it at its anchor."""
        if record.get("t_end") is not None or record.get("heal_step") is not None:
            self.to_heal[fault.id] = (fault, record.get("t_end"), record.get("heal_step"))
        elif record.get("length_s") is not None:
            self.anchored[fault.id] = (fault, float(record["length_s"]))

    def inject_arrivals(self, phase: PhaseState, step: int, out_of_job: list[int]) -> None:
        """Fire the Poisson processes' arrivals due by now, each rank at most once per boundary (a rank
        dead or ``out_of_job`` is skipped, journalled as such)."""
        if phase.name != "main":
            return
        registry, killed = kinds(), set(out_of_job)
        for process in self.arrivals:
            for fault in process.due(self.injector.now(), step):
                fresh = [r for r in fault.params["ranks"] if r not in killed]
                if not fresh:
                    why = "its target is already dead or out of the job at this boundary"
                    self.journal.emit(
                        "fault_injected", phase=phase.name, **fault.as_dict(), record={"skipped": why}
                    )
                    continue
                killed.update(fresh)
                fault = dataclasses.replace(fault, params={**fault.params, "ranks": fresh})
                with self.journal.bound(fault=fault.id):
                    record = registry[fault.kind].inject(self.injector, fault)
                    self.journal.emit("fault_injected", phase=phase.name, **fault.as_dict(), record=record)

    def heal_due(self, phase: PhaseState, step: int) -> None:
        """Heal the faults whose window (virtual time) or span (steps) has ended by this step boundary;
        an anchored fault's window ends ``length_s`` after the last rank started it."""
        registry, now = kinds(), self.injector.now
        started = self.injector.cluster.fault_anchors
        for fault_id, (fault, length) in sorted(self.anchored.items()):
            if fault_id in started:
                del self.anchored[fault_id]
                self.to_heal[fault_id] = (fault, started[fault_id] + length, None)
        for fault_id, (fault, t_end, heal_step) in sorted(self.to_heal.items()):
            if (t_end is not None and now() >= t_end) or (heal_step is not None and step >= heal_step):
                registry[fault.kind].heal(self.injector, fault)
                del self.to_heal[fault_id]
                self.journal.emit("fault_healed", phase=phase.name, id=fault_id, kind=fault.kind, t=now())

    def journal_hits(self, phase: str) -> None:
        """One ``fault_hits`` event with what each link fault acted on since the last one (messages
        dropped or slowed, link set-ups delayed or mismatched), if any did."""
        hits = self.injector.cluster.take_hits()
        if hits:
            self.journal.emit("fault_hits", phase=phase, hits=hits)

    def clear(self) -> None:
        """No fault in force any more (before the reference or the probe)."""
        self.to_heal.clear()
        self.anchored.clear()
        self.injector.state.push_link_faults(LinkFaultTable())
