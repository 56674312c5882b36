"""The controller: the training loop of one run, phase by phase and step by step.

A run has up to three phases, each journalled with its name:

- ``main``: the scenario as written, with its faults, checkpoints and recoveries;
- ``reference``: the same seed again from step 1, uninterrupted, when ``main``
  needed any recovery (the bit-for-bit yardstick of the completeness check);
- ``probe``: when ``main`` never resumed from a checkpoint, a resume from its
  newest committed checkpoint before the last step, to prove what it restores
  (both: :mod:`testbed.control.yardsticks`).

Each step: faults due fire and heal (:mod:`testbed.control.injection`), every
training rank runs it, a failed step is cured in place or recovered from as
the strategy says (:mod:`testbed.recovery`), the safeguards are checked
(:mod:`testbed.control.safeguards`), and a replica or a checkpoint due after it is
taken (:mod:`testbed.control.commit`). The controller is the recovery strategies'
:class:`~testbed.recovery.context.RecoveryContext`.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

from faults.arrivals import Arrivals
from testbed.actors.cluster import Cluster
from testbed.actors.outcome import Outcome
from testbed.control.commit import write_checkpoint
from testbed.control.controller_loss import KillPoints
from testbed.control.injection import ClusterInjector, FaultSchedule
from testbed.control.job_run import take_over
from testbed.control.partitioned import CutOff
from testbed.control.preemption import preemptions_for
from testbed.control.safeguards import check_safeguards
from testbed.control.state import PhaseState, RunState
from testbed.control.steps import LINK_DETAIL_MAX, LinkTotals, combined_digest, journal_step_end
from testbed.control.stretch import next_arrival, split, stretch_length, went_on, with_span
from testbed.control.yardsticks import Yardsticks
from testbed.core.errors import TestbedError
from testbed.core.journal import Journal
from testbed.integrity.inspector import inspector_for, policy_event
from testbed.integrity.respond import respond, safeguards_under
from testbed.recovery import elastic
from testbed.recovery.learned import Learner
from testbed.recovery.record import Recovery, Shrunk, failed_stage
from testbed.recovery.registry import strategy
from testbed.recovery.replica import replicate
from testbed.scenario.model import Scenario
from testbed.scenario.plan import make_plan, plan_digest
from testbed.train.replica_store import GENERATIONS, ReplicaGeneration

Outcomes = dict[int, Outcome]


class Controller(KillPoints, CutOff, Yardsticks):
    """Drives one scenario on one cluster and writes everything to the journal."""

    def __init__(
        self,
        scenario: Scenario,
        cluster: Cluster,
        journal: Journal,
        out_dir: Path,
        ckpt_dir: Path | None = None,
    ) -> None:
        """Drive ``scenario``; checkpoints go to ``ckpt_dir`` (default ``out_dir/checkpoints``)."""
        self.scenario = scenario
        self.cluster = cluster
        self.journal = journal
        self.out_dir = out_dir
        self.ckpt_dir = ckpt_dir or out_dir / "checkpoints"
        self.strategy = strategy(scenario.policy.recovery.strategy)
        self.state = RunState(cluster, ckpt_root=self.ckpt_dir, state_scale=scenario.workload.state_scale)
        self.injector = ClusterInjector(self.state, journal)
        self.faults = FaultSchedule(self.injector, journal)
        self.epoch = -1
        self.recoveries: list[Recovery] = []
        self.replica_gens: list[ReplicaGeneration] = []
        self.shrunk: Shrunk | None = None  # an elastic job with data-parallel replicas out
        learn = scenario.policy.timeouts.learn
        self.learner: Learner | None = Learner(learn) if learn is not None else None
        self.wall_start = time.monotonic()
        self.steps_since_start = 0  # steps trained since the job (re)started: the learner's warm-up
        self.step_t0: float | None = None  # when the step in flight began (the learned watchdog's start)
        self.step_wall_s: float | None = None  # the wall time of a step in the last call: a stretch's bound
        self.spans: list[float] = []  # the virtual spans of the last steps: a stretch before an arrival
        self.link_totals: dict[str, LinkTotals] = {}  # phase -> its links, in a large world
        self.inspector = inspector_for(scenario, journal, self.state)
        self.safeguards = safeguards_under(scenario)
        self.preempts = preemptions_for(self, self.state, scenario)

    # --- what a recovery strategy may see and do (RecoveryContext) -----------------------------
    @property
    def state_scale(self) -> float:
        """Modelled bytes of state per byte the numpy model holds (the workload's, or the job's)."""
        return self.state.state_scale

    @property
    def storage_Bps(self) -> float:
        """The shared storage's bandwidth now (the preset's, cut by an ``io_saturation`` fault)."""
        return self.state.storage_Bps

    def now(self) -> float:
        """The virtual time at this step boundary: the earliest rank's clock."""
        return self.state.now()

    def set_clock(self, rank: int, t: float) -> None:
        """``rank``'s clock moved to ``t`` outside a step (a snapshot for a replica)."""
        self.state.clock_of[rank] = t

    def set_shrunk(self, shrunk: Shrunk | None) -> None:
        """An elastic shrink is in force (or over)."""
        self.shrunk = shrunk

    def add_replica_generation(self, gen: ReplicaGeneration) -> None:
        """A replica generation was taken; ranks keep the last :data:`GENERATIONS`."""
        self.replica_gens = [*self.replica_gens[-(GENERATIONS - 1) :], gen]

    def forget_replicas_after(self, step: int) -> None:
        """Training goes back to ``step``: replicas of later steps describe a future that will be redone."""
        self.replica_gens = [g for g in self.replica_gens if g.step <= step]

    def add_recovery(self, rec: Recovery) -> None:
        """A recovery was made."""
        self.recoveries.append(rec)

    def trusted_steps(self) -> set[int] | None:
        """The verified steps, when ``policy.integrity`` restores only verified checkpoints."""
        integrity = self.scenario.policy.integrity
        return (
            self.state.verified_steps if integrity is not None and integrity.restore == "verified" else None
        )

    def resumed_from(self, manifest: dict[str, Any] | None) -> None:
        """The job restarted (from ``manifest``'s checkpoint, or from memory): warm up again, and take
        the timeouts that checkpoint saved as the ones learned before."""
        self.steps_since_start = 0
        if self.learner is not None and manifest is not None:
            self.learner = self.learner.resumed(manifest.get("timeouts"))

    def active_ranks(self) -> list[int]:
        """The ranks training now: all, unless an elastic job dropped data-parallel replicas."""
        if self.shrunk is None:
            return sorted(self.cluster.npus)
        layout = self.scenario.workload.layout()
        return [r for r in sorted(self.cluster.npus) if layout.coords(r).dp in self.shrunk.dp_active]

    def ranks_out(self) -> list[int]:
        """The ranks of the dropped data-parallel replicas (none unless shrunk)."""
        return sorted(set(self.cluster.npus) - set(self.active_ranks()))

    def open_group(self, t0: float, cold: bool = True, fresh: bool = False) -> float:
        """Open a new epoch of the world group at virtual ``t0``; returns when it is ready.
        ``cold``: after a start or a restart (its setup time may be learned); ``fresh``: the first
        epoch of a fresh job on ranks that became one (a yardstick's)."""
        self.epoch += 1
        ranks = self.active_ranks()
        dp_active = None if self.shrunk is None else list(self.shrunk.dp_active)
        self.cluster.call_ok("set_link_faults", self.state.link_faults, ranks=ranks)
        ready = self.cluster.call_ok(
            "open_group", self.epoch, self.cluster.addresses, t0, dp_active, fresh, ranks=ranks
        )
        self.state.clock_of = {r: float(v["t"]) for r, v in ready.items()}
        t = float(max(r["t"] for r in ready.values()))
        setup = max(r["setup_s"] for r in ready.values())
        link = max(r["link_setup_max_s"] for r in ready.values())
        self.journal.emit(
            "group_open", epoch=self.epoch, t_start=t0, t=t, setup_s=setup, link_setup_max_s=link
        )
        if cold:
            self.learn("setup", setup, epoch=self.epoch)
        return t

    # --- learning the timeouts ------------------------------------------------------------------
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

    def _learn_step(self, phase: PhaseState, step: int, out: Outcomes) -> None:
        """The step's longest interval over the ranks, past the warm-up, goes to the learner."""
        self.steps_since_start += 1
        if phase.name != "main" or self.learner is None:
            return
        if self.steps_since_start <= self.learner.policy.warmup_steps:
            return
        interval = max(float(o.value["t"]) - float(o.value["t_start"]) for o in out.values())
        self.learn("step", interval, step=step)

    # --- recovering ---------------------------------------------------------------------------
    def _recover(self, phase: PhaseState, fail_step: int, out: Outcomes) -> tuple[int, float]:
        """Recover after a failure as the strategy says; returns (the step to train next, not before).
        A recovery that fails is journalled (``recovery_failed``: at which stage, and why) and raised."""
        try:
            rec = self.strategy.go_back(self, phase, fail_step, out)
        except TestbedError as exc:
            self.journal_failed_recovery(phase.name, fail_step, exc)
            raise
        return self._went_back(phase, rec)

    def _went_back(self, phase: PhaseState, rec: Recovery) -> tuple[int, float]:
        """Training goes on as ``rec`` says: (the step to train next, not before)."""
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
            strategy=self.strategy.name,
            stage=failed_stage(exc),
            error_type=type(exc).__name__,
            error=str(exc),
        )

    def _maybe_complete(self, phase: PhaseState, step_done: int) -> None:
        rec = phase.recovering
        if rec is None or step_done < rec.fail_step - 1:
            return
        t_done = max(self.state.clock_of.values()) if step_done >= rec.resume_step else rec.t_resume
        rec.complete(self.journal, phase.name, t_done)
        phase.recovering = None

    # --- steps ----------------------------------------------------------------------------------
    def train(self, phase: PhaseState, first_step: int, not_before: float = 0.0) -> None:
        """Train ``first_step..steps``, recovering from failures as the policy says; every journal
        event of a step carries the step bound as context."""
        step = first_step
        while step <= self.scenario.workload.steps:
            with self.journal.bound(step=step):
                step, not_before = self._advance(phase, step, not_before)
                self.faults.journal_hits(phase.name)

    def _advance(self, phase: PhaseState, step: int, not_before: float) -> tuple[int, float]:
        """Run ``step`` (its faults, the step, a checkpoint or replica due after it); returns the step
        to train next and the virtual time it may not start before (a recovery may go back)."""
        if self.shrunk is not None and self.now() >= self.shrunk.t_ready:
            not_before = max(not_before, elastic.rejoin(self, phase, step))
        self.faults.heal_due(phase, step)
        self.faults.inject_arrivals(phase, step, self.ranks_out())
        self.faults.inject_due(phase, step)
        self._skip_data(phase, step)
        self.step_t0 = max(not_before, self.now())
        held, self.state.held_until = self.state.held_until, {}
        ranks = self.active_ranks()
        args = {r: (step, max(not_before, held.get(r, 0.0))) for r in ranks}
        killed_mid_step = partial(self.reached, "step.running")  # a controller kill armed for it
        t_start = max([*self.state.clock_of.values(), *(a[1] for a in args.values())])
        count, t_call = stretch_length(self, phase, step, self.step_wall_s, t_start), time.monotonic()
        if count > 1:
            per_rank = {r: (step, count, args[r][1]) for r in ranks}
            out = self.cluster.call("train_steps", ranks=ranks, per_rank=per_rank.__getitem__)
            steps = split(out, step, next_arrival(self, phase))
            self.step_wall_s = (time.monotonic() - t_call) / len(steps)
            return self._took_stretch(phase, step, steps)
        out = self.cluster.call("train_step", ranks=ranks, per_rank=args.__getitem__, sent=killed_mid_step)
        self.step_wall_s = time.monotonic() - t_call
        return self._took(phase, step, out)

    def _took_stretch(self, phase: PhaseState, first: int, steps: list[Outcomes]) -> tuple[int, float]:
        """Take a stretch's steps in order, each as a single step's call would have been taken."""
        last = first + len(steps) - 1  # split gives one step at least
        for step, out in enumerate(steps, start=first):
            with self.journal.bound(step=step):
                if step > first:
                    self.step_t0 = self.now()  # as at a boundary with nothing held
                after = self._took(phase, step, out)
                if step < last:
                    went_on(step, after)
                    self.faults.journal_hits(phase.name)
        return after

    def _took(self, phase: PhaseState, step: int, out: Outcomes) -> tuple[int, float]:
        """What follows ``step``'s call: a cure or a recovery, or the step's journal, the integrity
        policy's response, and a checkpoint, replica or preemption due after it."""
        if (left := self.preempts.after_call(phase, step, out)) is not None:
            return self._went_back(phase, left)
        if not all(o.ok for o in out.values()):
            out = self.strategy.cure(self, phase, step, out)
        if not all(o.ok for o in out.values()):
            return self._recover(phase, step, out)
        self._step_done(phase, step, out)
        if self.inspector is not None:
            rec = respond(
                self, self.inspector, self.state, phase, step, out, partial(self._kept, phase, step)
            )
            if rec is not None:
                return self._went_back(phase, rec)
        after = self._after_step(phase, step)
        left = self.preempts.after_step(phase, step) if after[0] == step + 1 else None
        return after if left is None else self._went_back(phase, left)

    def _skip_data(self, phase: PhaseState, step: int) -> None:
        """Throw away the batches a rollback skipped before ``step`` (the reference run too)."""
        count = self.inspector.skips.due(step) if self.inspector is not None else 0
        if count and phase.name in ("main", "reference"):
            self.cluster.call_ok("skip_batches", ranks=self.active_ranks(), per_rank=lambda r: (count,))
            self.journal.emit("batches_skipped", phase=phase.name, step=step, batches=count)

    def _kept(self, phase: PhaseState, step: int, out: Outcomes) -> None:
        """A replayed step's result is the one kept: journalled, its clocks and history taken."""
        for r, o in out.items():
            self.state.clock_of[r] = o.value["t"]
        dp_share = 1.0 if self.shrunk is None else len(self.shrunk.dp_active) / self.scenario.workload.dp
        journal_step_end(self.journal, phase, step, out, dp_share, self._link_totals(phase.name))
        if self.inspector is not None:
            self.inspector.record_healthy(step, out)

    def _step_done(self, phase: PhaseState, step: int, out: Outcomes) -> None:
        """Journal the step, check the safeguards, learn from it, close a recovery it completes."""
        for r, o in out.items():
            self.state.clock_of[r] = o.value["t"]
        self.spans = with_span(self.spans, out)
        dp_share = 1.0 if self.shrunk is None else len(self.shrunk.dp_active) / self.scenario.workload.dp
        journal_step_end(self.journal, phase, step, out, dp_share, self._link_totals(phase.name))
        check_safeguards(self.safeguards, self.journal, self.wall_start, phase.name, step, out)
        self._learn_step(phase, step, out)
        self._maybe_complete(phase, step)

    def _after_step(self, phase: PhaseState, step: int) -> tuple[int, float]:
        """The replica or checkpoint due after ``step`` (deferred while replicas are out)."""
        every = self.scenario.policy.checkpoint.every
        replica_every = self.scenario.policy.checkpoint.replicas_every(self.strategy.replicas_by_default)
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
        if not (due_checkpoint and self.shrunk is None):
            return step + 1, 0.0
        timeouts = self.learner.values() if self.learner is not None else None
        written = write_checkpoint(
            self.scenario,
            self.state,
            self.journal,
            phase,
            step,
            timeouts,
            lambda hold: self.learn("checkpoint", hold, step=step),
            self.preempts.deadline,
        )
        if written.failed is not None:  # a rank died writing it: the step is done, the checkpoint is not
            return self._recover(phase, step + 1, written.failed)
        self.faults.inject_due(phase, step, committed=True)
        clock, held = self.state.clock_of, self.state.held_until
        for r in clock:  # every rank waits for the checkpoint (or its snapshot)
            clock[r] = max(clock[r], written.t_resume, held.get(r, 0.0))
        return step + 1, written.t_resume

    def _link_totals(self, phase: str) -> LinkTotals | None:
        """Where a large world's links go, phase by phase (None: into each step's event)."""
        if self.cluster.topology.world <= LINK_DETAIL_MAX:
            return None
        return self.link_totals.setdefault(phase, LinkTotals())

    # --- phases ---------------------------------------------------------------------------------
    def _phase(self, phase: PhaseState, first_step: int) -> None:
        """Train one phase from ``first_step`` to the end, between its start and end events."""
        self.journal.emit("phase_start", phase=phase.name, first_step=first_step)
        try:
            self.train(phase, first_step)
        finally:  # the links' totals, also of a phase that failed for good
            totals = self.link_totals.pop(phase.name, None)
            if totals is not None:
                totals.journal(self.journal, phase.name)
        if self.learner is not None and phase.name == "main":
            self.journal.emit("timeouts_learned", phase=phase.name, **self.learner.values())
        digests = self.cluster.call_ok("digest", ranks=self.active_ranks())
        self.journal.emit(
            "phase_end",
            ranks_out=self.ranks_out(),
            phase=phase.name,
            steps=self.scenario.workload.steps,
            t=max(self.state.clock_of.values()),
            digest=combined_digest(digests),
            restarts=phase.restarts,
        )

    def run(self) -> None:
        """Main phase, then the reference or the probe."""
        plan = make_plan(self.scenario)
        resolved = [f.as_dict() for f in plan]
        self.journal.emit("plan", faults=resolved, plan_sha256=plan_digest(self.scenario, resolved))
        if self.inspector is not None or self.scenario.corrupts_silently:
            self.journal.emit("integrity", policy=policy_event(self.scenario.policy.integrity))
        self.faults.arrivals = [Arrivals.start(f, self.scenario.seed) for f in plan if "mtbf" in f.params]
        fixed = [f for f in plan if "mtbf" not in f.params]
        main = PhaseState("main", fixed, self.ckpt_dir)
        take_over(self.scenario, self.cluster, self.journal, self.state)
        self.faults.inject_due(main, 0)  # faults in force before the links are first set up
        try:
            self.open_group(0.0)
            self._phase(main, 1)
        finally:  # what the link faults did up to a failure for good is evidence too
            self.faults.journal_hits("main")
        self.yardsticks()
