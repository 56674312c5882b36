"""The controller: runs the training loop, injects the plan, detects, recovers, journals.

A run has up to three phases, each journalled with its name:

- ``main``: the scenario as written, with its faults, checkpoints and recoveries;
- ``reference``: the same seed again from step 1, uninterrupted, when ``main``
  needed any recovery (the bit-for-bit yardstick of the completeness check);
- ``probe``: when ``main`` never resumed from a checkpoint, a resume from its
  newest committed checkpoint before the last step, to prove what it restores.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faults.arrivals import Arrivals
from faults.kind import AFTER_COMMIT, PlannedFault, kinds
from faults.triggers import due
from testbed.actors.cluster import Cluster, Outcome
from testbed.core.errors import (
    CheckpointError,
    LinkSetupError,
    LinkSetupTimeout,
    RecoveryFailed,
    SafeguardTripped,
    TestbedError,
)
from testbed.core.journal import Journal
from testbed.fabric.linkfaults import LinkFault, LinkFaultTable
from testbed.recovery import elastic
from testbed.recovery.learned import Learner
from testbed.recovery.restart import Recovery, replica, restart
from testbed.recovery.retry import op_retry, op_retry_applies, step_retry, step_retry_applies
from testbed.scenario.model import Scenario
from testbed.scenario.plan import make_plan, plan_digest
from testbed.train import checkpoint as ckpt
from testbed.train.replica_store import ReplicaGeneration, replicate

#: Above this share of a step spent waiting for input, the run is warned (a rule of thumb).
DATA_WAIT_WARN = 0.15


def failed_stage(exc: BaseException) -> str:
    """The stage of a recovery an error stopped: none (no restart cures the failure), re-link (link
    setup), load (a checkpoint), the restart budget, or the restart itself."""
    if isinstance(exc, TestbedError) and exc.fields.get("beyond_recovery"):
        return "none"
    if isinstance(exc, (LinkSetupTimeout, LinkSetupError)):
        return "relink"
    if isinstance(exc, CheckpointError):
        return "load"
    if isinstance(exc, RecoveryFailed):
        return "budget"
    return "restart"


def combined_digest(digests: dict[int, str]) -> str:
    """One sha256 over every rank's parameter digest, in rank order."""
    h = hashlib.sha256()
    for rank in sorted(digests):
        h.update(digests[rank].encode())
    return h.hexdigest()


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


class Controller:
    """Drives one scenario on one cluster and writes everything to the journal."""

    def __init__(self, scenario: Scenario, cluster: Cluster, journal: Journal, out_dir: Path) -> None:
        self.scenario = scenario
        self.cluster = cluster
        self.journal = journal
        self.out_dir = out_dir
        self.epoch = -1
        self.clock_of: dict[int, float] = {}
        self.recoveries: list[Recovery] = []
        self.link_faults = LinkFaultTable()
        self.to_heal: dict[str, tuple[PlannedFault, float | None, int | None]] = {}
        self.ckpt_root: Path | None = out_dir / "checkpoints"
        self.storage_factor = 1.0  # the io_saturation fault cuts the storage bandwidth
        self.replica_gens: list[ReplicaGeneration] = []
        self.ckpt_pause: dict[int, float] = {}  # rank -> extra seconds its next checkpoint write takes
        self.held_until: dict[int, float] = {}  # rank -> not before, for the next step only
        self.shrunk: elastic.Shrunk | None = None  # an elastic job with data-parallel replicas out
        self.arrivals: list[Arrivals] = []  # Poisson fault processes (main phase only)
        learn = scenario.policy.timeouts.learn
        self.learner: Learner | None = Learner(learn) if learn is not None else None
        self.wall_start = time.monotonic()
        self.steps_since_start = 0  # steps trained since the job (re)started: the learner's warm-up
        self.step_t0: float | None = None  # when the step in flight began (the learned watchdog's start)

    # --- the injector interface offered to fault kinds --------------------
    def kill_now(self, rank: int, step: int) -> dict[str, Any]:
        """SIGKILL ``rank`` between steps (its clock is where its last step left it)."""
        return self.cluster.kill(rank, self.clock_of.get(rank, 0.0), step, "boundary")

    def arm_kill(self, rank: int, step: int, point: str) -> None:
        """Arm ``rank`` to be SIGKILLed at ``point`` of ``step``."""
        self.cluster.call_ok("arm_kill", step, point, ranks=[rank])

    def pause_checkpoint(self, rank: int, seconds: float) -> None:
        """Make ``rank``'s write of the next checkpoint take ``seconds`` longer."""
        self.ckpt_pause[rank] = self.ckpt_pause.get(rank, 0.0) + seconds

    def lose_ray_node(self, supernode: int, step: int) -> dict[str, Any]:
        """Take down the Ray node of ``supernode`` between steps (its NPUs' clocks are where they were)."""
        ranks = self.cluster.topology.ranks_of(supernode)
        t = min(self.clock_of.get(r, 0.0) for r in ranks)
        return self.cluster.lose_node(supernode, t, step)

    def arm_hang(self, rank: int, step: int, point: str) -> None:
        """Arm ``rank`` to freeze (SIGSTOP) at ``point`` of ``step``; calls stop waiting for it then."""
        self.cluster.call_ok("arm_kill", step, point, "hang", ranks=[rank])
        self.cluster.may_hang.add(rank)

    def now(self) -> float:
        """The virtual time at this step boundary: the earliest rank's clock."""
        return min(self.clock_of.values()) if self.clock_of else 0.0

    def add_link_faults(self, records: list[LinkFault]) -> None:
        """Put link-fault records in force on every rank."""
        self._push(self.link_faults.plus(records))

    def remove_link_faults(self, fault_id: str) -> None:
        """Lift every link-fault record of ``fault_id``."""
        self._push(self.link_faults.without(fault_id))

    def fragment_memory(
        self, ranks: list[int], fault_id: str, block: int, count: int, spacing: int
    ) -> dict[str, Any]:
        """Pin a pattern of blocks in the device memory of ``ranks``; returns each rank's stats after."""
        done = self.cluster.call_ok("fragment", fault_id, block, count, spacing, ranks=ranks)
        return {str(r): v for r, v in done.items()}

    @property
    def state_scale(self) -> float:
        """Modelled bytes of state per byte the numpy model holds (``workload.state_scale``)."""
        return self.scenario.workload.state_scale

    @property
    def storage_Bps(self) -> float:
        """The shared storage's bandwidth now (the preset's, cut by an ``io_saturation`` fault)."""
        return float(self.cluster.topology.preset.storage_Bps) * self.storage_factor

    def set_storage_bandwidth(self, factor: float) -> None:
        """Scale the storage bandwidth by ``factor`` (1 restores it)."""
        self.storage_factor = factor

    def set_storage_full(self, full: bool) -> None:
        """Make every rank's checkpoint writes fail with ENOSPC (or succeed again)."""
        self.cluster.call_ok("set_storage_full", full)

    def delay_data(self, ranks: list[int], seconds: float) -> None:
        """Make each step of ``ranks`` wait ``seconds`` for its input (0 ends it)."""
        self.cluster.call_ok("set_data_delay", seconds, ranks=ranks)

    def slow_down(self, ranks: list[int], factor: float) -> None:
        """Multiply the compute time of ``ranks`` by ``factor`` from now on (1 ends it)."""
        self.cluster.call_ok("set_slowdown", factor, ranks=ranks)

    def corrupt_checkpoint(self, step: int, rank: int, component: str) -> dict[str, Any]:
        """Flip 8 bytes in the middle of ``rank``'s ``component`` file of the checkpoint of ``step``."""
        assert self.ckpt_root is not None
        path = ckpt.step_dir(self.ckpt_root, step) / f"rank_{rank:05d}" / f"{component}.npz"
        if not path.is_file():
            return {"path": str(path), "corrupted": False, "why": "no such committed file"}
        data = bytearray(path.read_bytes())
        offset = len(data) // 2
        data[offset : offset + 8] = bytes(b ^ 0xFF for b in data[offset : offset + 8])
        path.write_bytes(bytes(data))
        return {"path": str(path), "corrupted": True, "offset": offset, "bytes": 8}

    def release_memory(self, ranks: list[int], fault_id: str) -> None:
        """Free the blocks ``fault_id`` pinned."""
        self.cluster.call_ok("release", fault_id, ranks=ranks)

    def remove_operators(self, rank: int, ops: list[str]) -> None:
        """From now on ``rank``'s device lacks ``ops``."""
        self.cluster.call_ok("set_missing_ops", ops, ranks=[rank])

    def _push(self, table: LinkFaultTable) -> None:
        self.link_faults = table
        if self.cluster.npus:
            self.cluster.call_ok("set_link_faults", table)

    # --- group and steps ---------------------------------------------------
    def open_group(self, t0: float, cold: bool = True) -> float:
        """Open a new epoch of the world group at virtual ``t0``; returns when it is ready.
        ``cold``: after a start or a restart (its setup time may be learned)."""
        self.epoch += 1
        ranks = self.active_ranks()
        dp_active = None if self.shrunk is None else list(self.shrunk.dp_active)
        self.cluster.call_ok("set_link_faults", self.link_faults, ranks=ranks)
        ready = self.cluster.call_ok(
            "open_group", self.epoch, self.cluster.addresses, t0, dp_active, ranks=ranks
        )
        self.clock_of = {r: float(v["t"]) for r, v in ready.items()}
        t = float(max(r["t"] for r in ready.values()))
        setup = max(r["setup_s"] for r in ready.values())
        self.journal.emit("group_open", epoch=self.epoch, t_start=t0, t=t, setup_s=setup)
        if cold:
            self.learn("setup", setup, epoch=self.epoch)
        return t

    def learn(self, phase: str, interval: float, **where: Any) -> None:
        """Feed the learner one interval, after journalling it if it outlasted the timeout in force
        (the learned watchdog would have fired on a healthy job: a false timeout)."""
        if self.learner is None:
            return
        limit = self.learner.timeout(phase)
        if limit is not None and interval > limit:
            self.journal.emit(
                "learned_timeout_exceeded", phase_of_job=phase, interval=interval, timeout=limit, **where
            )
        self.learner.observe(phase, interval)

    def active_ranks(self) -> list[int]:
        """The ranks training now: all, unless an elastic job dropped data-parallel replicas."""
        if self.shrunk is None:
            return sorted(self.cluster.npus)
        layout = self.scenario.workload.layout()
        return [r for r in sorted(self.cluster.npus) if layout.coords(r).dp in self.shrunk.dp_active]

    def ranks_out(self) -> list[int]:
        """The ranks of the dropped data-parallel replicas (none unless shrunk)."""
        return sorted(set(self.cluster.npus) - set(self.active_ranks()))

    def _inject_due(self, phase: PhaseState, step: int, committed: bool = False) -> None:
        """Inject the faults due at the boundary before ``step``, or (``committed``) those that act on
        the checkpoint of ``step`` just committed."""
        registry = kinds()
        for fault in phase.faults:
            if (fault.point == AFTER_COMMIT) != committed:
                continue
            if due(fault, step, self.now) and fault.id not in phase.fired:
                phase.fired.add(fault.id)
                fault = dataclasses.replace(fault, step=step)  # a timed fault acts at this boundary
                with self.journal.bound(fault=fault.id):
                    record = registry[fault.kind].inject(self, fault)
                    self.journal.emit("fault_injected", phase=phase.name, **fault.as_dict(), record=record)
                if record.get("t_end") is not None or record.get("heal_step") is not None:
                    self.to_heal[fault.id] = (fault, record.get("t_end"), record.get("heal_step"))

    def _inject_arrivals(self, phase: PhaseState, step: int) -> None:
        """Fire the Poisson processes' arrivals due by now, each rank at most once per boundary."""
        if phase.name != "main":
            return
        registry, killed = kinds(), set(self.ranks_out())
        for process in self.arrivals:
            for fault in process.due(self.now(), step):
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
                    record = registry[fault.kind].inject(self, fault)
                    self.journal.emit("fault_injected", phase=phase.name, **fault.as_dict(), record=record)

    def _heal_due(self, phase: PhaseState, step: int) -> None:
        """Heal the faults whose window (virtual time) or span (steps) has ended by this step boundary."""
        registry = kinds()
        for fault_id, (fault, t_end, heal_step) in sorted(self.to_heal.items()):
            if (t_end is not None and self.now() >= t_end) or (heal_step is not None and step >= heal_step):
                registry[fault.kind].heal(self, fault)
                del self.to_heal[fault_id]
                self.journal.emit(
                    "fault_healed", phase=phase.name, id=fault_id, kind=fault.kind, t=self.now()
                )

    def _warn_data_wait(self, phase: PhaseState, step: int, vals: dict[int, Any]) -> None:
        """Warn once per phase when a step spends more than 15 % of its time waiting for input."""
        span = max(v["t"] for v in vals.values()) - min(v["t_start"] for v in vals.values())
        waited = max(v.get("data_wait_s", 0.0) for v in vals.values())
        if span <= 0 or waited / span <= DATA_WAIT_WARN or phase.warned_data:
            return
        phase.warned_data = True
        self.journal.emit(
            "warning",
            phase=phase.name,
            step=step,
            message=(
                f"step {step} waited {waited:.3g} s of {span:.3g} s ({waited / span:.0%}) for its input, "
                f"over the {DATA_WAIT_WARN:.0%} rule of thumb: the input pipeline, not the NPUs, sets the "
                "pace"
            ),
        )

    def _step_end(self, phase: PhaseState, step: int, out: dict[int, Outcome]) -> None:
        vals = {r: o.value for r, o in out.items()}
        self._warn_data_wait(phase, step, vals)
        for r, v in vals.items():
            self.clock_of[r] = v["t"]
        ranks = sorted(vals)
        losses = [vals[r]["loss"] for r in ranks if vals[r]["loss"] is not None]  # last pipeline stage
        self.journal.emit(
            "step_end",
            phase=phase.name,
            step=step,
            loss=sum(losses) / len(losses),
            lr=vals[ranks[0]]["lr"],
            t_start=min(v["t_start"] for v in vals.values()),
            dp_share=1.0 if self.shrunk is None else len(self.shrunk.dp_active) / self.scenario.workload.dp,
            t=max(v["t"] for v in vals.values()),
            t_ranks=[vals[r]["t"] for r in ranks],
            flops=[vals[r]["flops"] for r in ranks],
            data_wait_s=[vals[r].get("data_wait_s", 0.0) for r in ranks],
            compute_s=[vals[r]["compute_s"] for r in ranks],
            comm_wait_s=[vals[r]["comm_wait_s"] for r in ranks],
            bubble_s=[vals[r]["bubble_s"] for r in ranks],
            digest=combined_digest({r: vals[r]["digest"] for r in ranks}),
            algorithms=vals[ranks[0]]["algorithms"],
            links={str(r): vals[r]["links"] for r in ranks},
            wait_by_op={str(r): vals[r]["wait_by_op"] for r in ranks},
            memory={k: [vals[r]["memory"][k] for r in ranks] for k in vals[ranks[0]]["memory"]},
            memory_events={str(r): vals[r]["memory_events"] for r in ranks if vals[r]["memory_events"]},
        )

    def _checkpoint(self, phase: PhaseState, step: int) -> tuple[float, dict[int, Outcome] | None]:
        """Write and commit the checkpoint of ``step``: (when the write ends, virtual; None) on success,
        (0, every rank's outcome) when a rank died writing it (the checkpoint stays uncommitted)."""
        assert phase.ckpt_root is not None
        final = ckpt.step_dir(phase.ckpt_root, step)
        if final.exists():  # written before a restart: keep it if it verifies, else write it again
            try:
                ckpt.verify(final)
                self.journal.emit("checkpoint_exists", phase=phase.name, step=step)
                return 0.0, None
            except CheckpointError as exc:
                moved = ckpt.quarantine(final)
                self.journal.emit(
                    "checkpoint_quarantined", phase=phase.name, step=step, reason=str(exc), to=str(moved)
                )
        include = list(self.scenario.policy.checkpoint.include)
        tmp = ckpt.step_dir(phase.ckpt_root, step, tmp=True)
        tmp.mkdir(parents=True, exist_ok=True)
        out = self.cluster.call("save_shard", str(tmp), include)
        if not all(o.ok for o in out.values()):
            written = sorted(r for r, o in out.items() if o.ok)
            errors = {str(r): str(o.error) for r, o in out.items() if isinstance(o.error, CheckpointError)}
            self.journal.emit(
                "checkpoint_failed",
                phase=phase.name,
                step=step,
                path=str(tmp),
                written=written,
                errors=errors,
            )
            if len(errors) + len(written) == len(out):  # write errors only, no process lost: train on
                return 0.0, None
            return 0.0, out
        shards = {r: o.value for r, o in out.items()}
        nbytes = sum(e["bytes"] for s in shards.values() for e in s["entries"].values())
        write_s = float(nbytes) * self.state_scale / self.storage_Bps
        t_saved = float(max(s["t"] for s in shards.values()))
        if self.scenario.policy.checkpoint.async_:
            # a snapshot to host memory (the slowest rank's bytes over HBM bandwidth), then training goes
            # on while the shared storage takes the bytes in the background
            rank_bytes = max(sum(e["bytes"] for e in s["entries"].values()) for s in shards.values())
            t_resume = t_saved + rank_bytes * self.state_scale / self.cluster.topology.preset.hbm_Bps
            t_end = t_resume + write_s
        else:
            t_end = t_resume = t_saved + write_s
        w = self.scenario.workload
        manifest = {
            "step": step,
            "world": self.cluster.topology.world,
            "layout": {"dp": w.dp, "tp": w.tp, "pp": w.pp, "ep": w.ep},
            "workload": w.name,
            "seed": self.scenario.seed,
            "include": include,
            "ranks": {str(r): s["entries"] for r, s in shards.items()},
            "t_persisted": t_end,
        }
        if self.learner is not None:
            manifest["timeouts"] = self.learner.values()
        path = ckpt.commit(phase.ckpt_root, step, manifest)
        self.journal.emit(
            "checkpoint_committed",
            phase=phase.name,
            step=step,
            path=str(path),
            include=include,
            ranks={str(r): sorted(s["entries"]) for r, s in shards.items()},
            audit={str(r): s["audit"] for r, s in shards.items()},
            layout=manifest["layout"],
            world=manifest["world"],
            bytes=nbytes,
            write_s=write_s,
            t=t_end,
            t_resume=t_resume,
            asynchronous=self.scenario.policy.checkpoint.async_,
            paused={str(r): s for r, s in sorted(self.ckpt_pause.items())},
        )
        paused, self.ckpt_pause = self.ckpt_pause, {}
        for r, extra in paused.items():  # a paused writer goes on later; the others wait for it in step+1
            self.held_until[r] = t_resume + extra
        if not self.scenario.policy.checkpoint.async_:  # an async save's hold is only its snapshot
            self.learn("checkpoint", t_resume - t_saved + max(paused.values(), default=0.0), step=step)
        removed = ckpt.prune(phase.ckpt_root, self.scenario.policy.checkpoint.keep)
        if removed:
            self.journal.emit("checkpoint_pruned", phase=phase.name, steps=removed)
        return t_resume, None

    def forget_replicas_after(self, step: int) -> None:
        """Training goes back to ``step``: replicas of later steps describe a future that will be redone."""
        self.replica_gens = [g for g in self.replica_gens if g.step <= step]

    def _recover(self, phase: PhaseState, fail_step: int, out: dict[int, Outcome]) -> tuple[int, float]:
        """Recover after a failure as the policy says; returns (the step to train next, not before).
        A recovery that fails is journalled (``recovery_failed``: at which stage, and why) and raised."""
        how = replica if self.scenario.policy.recovery.strategy == "replica" else restart
        try:
            rec = how(self, phase, fail_step, out)
        except TestbedError as exc:
            self.journal_failed_recovery(phase.name, fail_step, exc)
            raise
        self.recoveries.append(rec)
        phase.recovering = rec
        self._maybe_complete(phase, rec.resume_step - 1)
        return rec.resume_step, rec.t_resume

    def journal_failed_recovery(self, phase: str, fail_step: int, exc: TestbedError) -> None:
        """A ``recovery_failed`` event: the strategy, the stage that failed and its error (after a
        ``failure_detected``; nothing when the failure itself was beyond any recovery)."""
        last = next((e for e in reversed(self.journal.events) if e["event"] == "failure_detected"), None)
        if last is None or last.get("phase") != phase or last.get("step") != fail_step:
            return
        self.journal.emit(
            "recovery_failed",
            phase=phase,
            fail_step=fail_step,
            strategy=self.scenario.policy.recovery.strategy,
            stage=failed_stage(exc),
            error_type=type(exc).__name__,
            error=str(exc),
        )

    def train(self, phase: PhaseState, first_step: int, not_before: float = 0.0) -> None:
        """Train ``first_step..steps``, recovering from failures as the policy says; every journal
        event of a step carries the step bound as context."""
        step = first_step
        while step <= self.scenario.workload.steps:
            with self.journal.bound(step=step):
                step, not_before = self._advance(phase, step, not_before)
                self.journal_hits(phase.name)

    def journal_hits(self, phase: str) -> None:
        """One ``fault_hits`` event with what each link fault acted on since the last one (messages
        dropped or slowed, link set-ups delayed or mismatched), if any did."""
        hits = self.cluster.take_hits()
        if hits:
            self.journal.emit("fault_hits", phase=phase, hits=hits)

    def _advance(self, phase: PhaseState, step: int, not_before: float) -> tuple[int, float]:
        """Run ``step`` (its faults, the step, a checkpoint or replica due after it); returns the step
        to train next and the virtual time it may not start before (a recovery may go back)."""
        every = self.scenario.policy.checkpoint.every
        replica_every = self.scenario.policy.checkpoint.replicas_every(self.scenario.policy.recovery.strategy)
        if self.shrunk is not None and self.now() >= self.shrunk.t_ready:
            not_before = max(not_before, elastic.rejoin(self, phase, step))
        self._heal_due(phase, step)
        self._inject_arrivals(phase, step)
        self._inject_due(phase, step)
        self.step_t0 = max(not_before, self.now())
        held, self.held_until = self.held_until, {}
        ranks = self.active_ranks()
        args = {r: (step, max(not_before, held.get(r, 0.0))) for r in ranks}
        out = self.cluster.call("train_step", ranks=ranks, per_rank=args.__getitem__)
        if not all(o.ok for o in out.values()):
            out = self._retry_or_shrink(phase, step, out)
        if not all(o.ok for o in out.values()):
            return self._recover(phase, step, out)
        self._step_end(phase, step, out)
        self._guard(phase, step, out)
        self._learn_step(phase, step, out)
        self._maybe_complete(phase, step)
        due_checkpoint = phase.ckpt_root is not None and every and step % every == 0
        due_replica = phase.name == "main" and replica_every and step % replica_every == 0
        if self.shrunk is not None and (due_checkpoint or due_replica):
            self.journal.emit(
                "checkpoint_deferred",
                phase=phase.name,
                step=step,
                reason=f"ranks {self.ranks_out()} are out of the job until their replica rejoins",
            )
        elif due_replica:
            replicate(self, phase.name, step)
        not_before = 0.0
        if due_checkpoint and self.shrunk is None:
            not_before, failed = self._checkpoint(phase, step)
            if failed is not None:  # a rank died writing it: the step is done, the checkpoint is not
                return self._recover(phase, step + 1, failed)
            self._inject_due(phase, step, committed=True)
            for r in self.clock_of:  # every rank waits for the checkpoint (or its snapshot)
                self.clock_of[r] = max(self.clock_of[r], not_before, self.held_until.get(r, 0.0))
        return step + 1, not_before

    def _guard(self, phase: PhaseState, step: int, out: dict[int, Outcome]) -> None:
        """The scenario's safeguards: a diverged loss, too many failures, the wall-time budget."""
        guards = self.scenario.safeguards
        losses = [o.value["loss"] for o in out.values() if o.value.get("loss") is not None]
        why = ""
        if guards.nan_loss and any(not math.isfinite(float(x)) for x in losses):
            why = f"the loss is {losses[0]} at step {step}: training diverged (safeguards.nan_loss)"
        if guards.max_failures is not None:  # counted only when bounded: a scan of the journal
            failures = sum(
                1
                for e in self.journal.events
                if e["event"] == "failure_detected" and e.get("phase") == "main"
            )
            if failures > guards.max_failures:
                bound = guards.max_failures
                why = f"{failures} failures by step {step}, past safeguards.max_failures = {bound}"
        elapsed = time.monotonic() - self.wall_start
        if guards.wall_s is not None and elapsed > guards.wall_s:
            why = f"{elapsed:.1f} s of wall time by step {step}, past safeguards.wall_s = {guards.wall_s:g} s"
        if why:
            self.journal.emit("safeguard_tripped", phase=phase.name, step=step, reason=why)
            raise SafeguardTripped(why, step=step)

    def _learn_step(self, phase: PhaseState, step: int, out: dict[int, Outcome]) -> None:
        """The step's longest interval over the ranks, past the warm-up, goes to the learner."""
        self.steps_since_start += 1
        if phase.name != "main" or self.learner is None:
            return
        if self.steps_since_start <= self.learner.policy.warmup_steps:
            return
        interval = max(float(o.value["t"]) - float(o.value["t_start"]) for o in out.values())
        self.learn("step", interval, step=step)

    def resumed_from(self, manifest: dict[str, Any] | None) -> None:
        """The job restarted (from ``manifest``'s checkpoint, or from memory): warm up again, and take
        the timeouts that checkpoint saved as the ones learned before."""
        self.steps_since_start = 0
        if self.learner is not None and manifest is not None:
            self.learner = self.learner.resumed(manifest.get("timeouts"))

    def _retry_or_shrink(self, phase: PhaseState, step: int, out: dict[int, Outcome]) -> dict[int, Outcome]:
        """The strategies that keep the job running: op retry, step retry, elastic shrink.
        Returns the step's outcomes after them (still failed when none applied or helped)."""
        if op_retry_applies(self, out):
            out = op_retry(self, phase, step, out)
        if not all(o.ok for o in out.values()) and step_retry_applies(self, out):
            out = step_retry(self, phase, step, out)
        if all(o.ok for o in out.values()) or self.scenario.policy.recovery.strategy != "elastic":
            return out
        reason = elastic.why_not(self, out)
        if reason is None:
            return elastic.shrink(self, phase, step, out)
        self.journal.emit("elastic_unavailable", phase=phase.name, step=step, reason=reason)
        return out

    def _maybe_complete(self, phase: PhaseState, step_done: int) -> None:
        rec = phase.recovering
        if rec is None or step_done < rec.fail_step - 1:
            return
        t_done = max(self.clock_of.values()) if step_done >= rec.resume_step else rec.t_resume
        rec.complete(self.journal, phase.name, t_done)
        phase.recovering = None

    # --- phases ------------------------------------------------------------
    def _phase(self, phase: PhaseState, first_step: int) -> None:
        """Train one phase from ``first_step`` to the end, between its start and end events."""
        self.journal.emit("phase_start", phase=phase.name, first_step=first_step)
        self.train(phase, first_step)
        if self.learner is not None and phase.name == "main":
            self.journal.emit("timeouts_learned", phase=phase.name, **self.learner.values())
        digests = self.cluster.call_ok("digest", ranks=self.active_ranks())
        self.journal.emit(
            "phase_end",
            ranks_out=self.ranks_out(),
            phase=phase.name,
            steps=self.scenario.workload.steps,
            t=max(self.clock_of.values()),
            digest=combined_digest(digests),
            restarts=phase.restarts,
        )

    def run(self) -> None:
        """Main phase, then the reference or the probe."""
        plan = make_plan(self.scenario)
        resolved = [f.as_dict() for f in plan]
        self.journal.emit("plan", faults=resolved, plan_sha256=plan_digest(self.scenario, resolved))
        self.arrivals = [Arrivals.start(f, self.scenario.seed) for f in plan if "mtbf" in f.params]
        fixed = [f for f in plan if "mtbf" not in f.params]
        main = PhaseState("main", fixed, self.out_dir / "checkpoints")
        self._inject_due(main, 0)  # faults in force before the links are first set up
        try:
            self.open_group(0.0)
            self._phase(main, 1)
        finally:  # what the link faults did up to a failure for good is evidence too
            self.journal_hits("main")
        if self.recoveries:
            self._reference()
        if not any(r.resumed for r in self.recoveries):
            self._probe()  # main never resumed from a checkpoint: prove the checkpoint another way

    def _clear_faults(self) -> None:
        self.shrunk = None
        self.to_heal.clear()
        self._push(LinkFaultTable())

    def _reference(self) -> None:
        self._clear_faults()
        self.cluster.call_ok("reset", 0.0)
        self.open_group(0.0)
        self._phase(PhaseState("reference", [], None), 1)

    def _probe(self) -> None:
        loadable, _ = ckpt.newest(self.out_dir / "checkpoints", before=self.scenario.workload.steps)
        if loadable is None:
            self.journal.emit("probe_skipped", reason="no committed checkpoint before the last step")
            return
        self._clear_faults()
        self.cluster.call_ok("reset", 0.0)
        t = self.open_group(0.0)
        restore = self.scenario.policy.checkpoint.restore
        self.cluster.call_ok("restore", per_rank=lambda r: (loadable.files_of(r, restore),))
        self.journal.emit(
            "resume",
            phase="probe",
            from_step=loadable.step,
            t=t,
            components={str(r): sorted(loadable.files_of(r, restore)) for r in self.cluster.npus},
        )
        self._phase(PhaseState("probe", [], None), loadable.step + 1)
