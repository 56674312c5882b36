"""Storage faults: checkpoints that do not survive on disk.

- ``storage_torn_write``: the targeted rank's process is SIGKILLed while it
  writes its shard of a checkpoint (half of its first file is on disk). The
  checkpoint is never committed; its temporary directory stays behind, torn,
  and is never loaded. The job restarts from the previous checkpoint.
- ``checkpoint_pause``: one rank's write of its shard takes ``pause`` longer
  (a slow metadata server, a throttled volume). The others finish first and
  go on to the next step, where they wait for it in the first collective:
  an exec timeout shorter than the pause fires there, falsely (the rank is
  healthy, only late). Timeout tuning rehearses this.
- ``storage_corrupt``: as soon as a checkpoint is committed, bytes of one
  rank's component file are flipped on disk (bit rot, a bad disk). A restart that
  would load it finds its sha256 wrong, skips it with a journal event, and
  takes the previous one.

``at: {step: N}`` names the first checkpoint at or after step N.
"""

from __future__ import annotations

import errno
from dataclasses import replace
from typing import Any, ClassVar

from hypothesis import strategies as st

from faults.evidence import Effect, Evidence
from faults.kind import (
    AFTER_COMMIT,
    ClusterFacts,
    DrawFacts,
    FaultKind,
    FaultSpec,
    Injector,
    PlannedFault,
    Problems,
    checkpoint_step,
    heal_step,
    on_rank,
    one_of,
    register,
    span_problems,
)
from faults.targets import single_rank, target_problems
from testbed.core.units import parse_duration
from testbed.train.checkpoint import COMPONENTS, FULL_AT


def _validate(spec: FaultSpec, facts: ClusterFacts, kind: str, need_after: bool) -> Problems:
    problems: Problems = target_problems(spec, facts, kind, single=True)
    step = spec.at.get("step")
    every = facts.checkpoint_every
    if set(spec.at) != {"step"} or not isinstance(step, int) or isinstance(step, bool) or step < 1:
        problems.append((("at",), f"{kind} needs 'at: {{step: N}}' with N at least 1"))
    elif every <= 0:
        problems.append(
            (("at",), f"{kind} hits a checkpoint, but none is written; set policy.checkpoint.every")
        )
    else:
        ck = checkpoint_step(step, every)
        last = facts.steps - 1 if need_after else facts.steps
        if ck > last:
            problems.append(
                (
                    ("at", "step"),
                    f"the first checkpoint at or after step {step} is step {ck}, past step {last}; "
                    "pick an earlier step",
                )
            )
    return problems


@register
class StorageTornWrite(FaultKind):
    """The writer of a checkpoint shard dies mid-write."""

    name = "storage_torn_write"
    triggers = ()
    ends_process = True
    acts_on_checkpoint = True
    real_failure = True
    description = (
        "SIGKILL a rank while it writes its shard of a checkpoint; the checkpoint is never committed"
    )

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> Problems:
        """One rank, a checkpoint inside the run."""
        return _validate(spec, facts, self.name, need_after=False)

    def plan(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> PlannedFault:
        """The checkpoint's step; the point half-way through the rank's first file."""
        step = checkpoint_step(int(spec.at["step"]), facts.checkpoint_every)
        return PlannedFault(
            f"f{spec.index}-{self.name}", self.name, single_rank(spec, seed, facts), step, "shard.mid"
        )

    def inject(self, injector: Injector, fault: PlannedFault) -> dict[str, Any]:
        """Arm the rank to die half-way through writing its shard of this step's checkpoint."""
        injector.arm_kill(fault.rank, fault.step, fault.point)
        return {"armed": fault.point, "checkpoint": fault.step}

    def heal(self, injector: Injector, fault: PlannedFault) -> None:
        """A dead writer stays dead: recovery replaces it."""

    def effect(self, fired: dict[str, Any], evidence: Evidence) -> Effect:
        """The rank died half-way through its shard of the checkpoint."""
        rank, step = int(fired.get("rank", -1)), int(fired.get("step", 0))
        if evidence.deaths([rank], step, "shard.mid"):
            return Effect(True, f"killed rank {rank} half-way through its shard of checkpoint {step}")
        return Effect(
            False, f"rank {rank} never wrote its shard of checkpoint {step}{evidence.ended_early()}"
        )


@register
class StorageCorrupt(FaultKind):
    """Bytes of a committed checkpoint shard flip on disk."""

    name = "storage_corrupt"
    triggers = ()
    acts_on_checkpoint = True
    drill_order = 5
    description = "flip bytes in one rank's component file of a committed checkpoint"
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {
        "component": ("text", "the component whose file of the shard is corrupted (params, optimizer, ...)"),
    }
    params: ClassVar[dict[str, Any]] = {"component": "optimizer"}

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> Problems:
        """One rank, a checkpoint before the last step, a component."""
        problems = _validate(spec, facts, self.name, need_after=True)
        comp = spec.params.get("component", self.params["component"])
        if comp not in COMPONENTS:
            problems.append(
                (("component",), f"'{comp}' is not a component; use one of {', '.join(COMPONENTS)}")
            )
        return problems

    def plan(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> PlannedFault:
        """Strike right after the checkpoint of the step is committed."""
        ck = checkpoint_step(int(spec.at["step"]), facts.checkpoint_every)
        comp = str(spec.params.get("component", self.params["component"]))
        return PlannedFault(
            f"f{spec.index}-{self.name}",
            self.name,
            single_rank(spec, seed, facts),
            ck,
            AFTER_COMMIT,
            {"checkpoint": ck, "component": comp},
        )

    def drawable(self, facts: DrawFacts) -> bool:
        """Also: a saved component to corrupt."""
        return super().drawable(facts) and bool(facts.corruptible)

    def draw(self, draw: Any, facts: DrawFacts, rank: int) -> dict[str, Any]:
        """A saved component of the rank's shard flipped at a checkpoint before the last step."""
        step = draw(st.sampled_from(facts.checkpoints))
        return {**on_rank(self.name, rank, step), "component": draw(st.sampled_from(facts.corruptible))}

    def inject(self, injector: Injector, fault: PlannedFault) -> dict[str, Any]:
        """Flip the bytes now."""
        p = fault.params
        return injector.corrupt_checkpoint(int(p["checkpoint"]), fault.rank, str(p["component"]))

    def heal(self, injector: Injector, fault: PlannedFault) -> None:
        """Corrupt bytes stay corrupt."""

    def damaged_checkpoint(self, fired: dict[str, Any]) -> int | None:
        """The checkpoint whose bytes this firing flipped."""
        return int(fired["params"]["checkpoint"])

    def effect(self, fired: dict[str, Any], evidence: Evidence) -> Effect:
        """Bytes flipped in a committed file, or why none was there."""
        record, p = fired.get("record", {}), fired.get("params", {})
        what = f"rank {fired.get('rank', -1)}'s {p['component']} file of checkpoint {p['checkpoint']}"
        if record.get("corrupted"):
            return Effect(True, f"flipped {record.get('bytes', 8)} bytes of {what}")
        return Effect(False, f"{what}: {record.get('why', 'not there')}")


def _window(spec: FaultSpec, facts: ClusterFacts, kind: str) -> Problems:
    """``at: {step: N}`` inside the run and an optional ``for_steps`` of at least 1."""
    problems: Problems = []
    step = spec.at.get("step")
    if (
        set(spec.at) != {"step"}
        or not isinstance(step, int)
        or isinstance(step, bool)
        or not 1 <= step <= facts.steps
    ):
        problems.append((("at",), f"{kind} needs 'at: {{step: N}}' with N in 1..{facts.steps}"))
    problems += span_problems(spec)
    if spec.target not in ({}, {"storage": "shared"}):
        problems.append(
            (("target",), f"{kind} acts on the shared storage: write 'target: {{storage: shared}}'")
        )
    return problems


@register
class IOSaturation(FaultKind):
    """The shared storage's bandwidth is cut: checkpoints take longer to write and to load."""

    name = "io_saturation"
    slows_only = True
    description = "cut the shared storage bandwidth to 'factor' of the preset's for 'for_steps' steps"
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {
        "factor": ("number", "the share of the storage bandwidth left, in (0, 1]"),
    }
    params: ClassVar[dict[str, Any]] = {"factor": 0.1, "for_steps": None}

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> Problems:
        """A step, a span, a factor in (0, 1]."""
        problems = _window(spec, facts, self.name)
        factor = spec.params.get("factor", self.params["factor"])
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
            problems.append(
                (("factor",), f"factor is the bandwidth left, in (0, 1] (0.1: a tenth), got {factor!r}")
            )
        return problems

    def plan(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> PlannedFault:
        """The factor and the span."""
        p = {**self.params, **spec.params}
        params = {"factor": float(p["factor"]), "for_steps": p["for_steps"]}
        return PlannedFault(
            f"f{spec.index}-{self.name}", self.name, -1, int(spec.at["step"]), "boundary", params
        )

    def inject(self, injector: Injector, fault: PlannedFault) -> dict[str, Any]:
        """Cut the bandwidth now."""
        injector.set_storage_bandwidth(fault.params["factor"])
        return {"factor": fault.params["factor"], "heal_step": heal_step(fault)}

    def heal(self, injector: Injector, fault: PlannedFault) -> None:
        """Full bandwidth again."""
        injector.set_storage_bandwidth(1.0)

    def effect(self, fired: dict[str, Any], evidence: Evidence) -> Effect:
        """The checkpoints written, and the loads, while the bandwidth was cut."""
        written = [c["step"] for c in evidence.commits_in(fired)]
        first, last = evidence.window(fired)
        loads = [
            e
            for e in evidence.events
            if e.get("event") == "resume"
            and e.get("source", "checkpoint") == "checkpoint"
            and e.get("checkpoint", True)
            and first <= e.get("step", 0)
            and (last is None or e.get("step", 0) < last)
        ]
        if not written and not loads:
            return Effect(False, "no checkpoint was written or loaded while the bandwidth was cut")
        factor = fired.get("params", {}).get("factor", 1.0)
        parts = [f"checkpoint(s) {', '.join(map(str, written))} written" if written else ""]
        parts.append(f"{len(loads)} load(s)" if loads else "")
        return Effect(True, " and ".join(p for p in parts if p) + f" at {factor:g} of the bandwidth")


#: the errors a full checkpoint storage gives: no space left, or the quota exceeded
FULL_ERRNOS = {"ENOSPC": errno.ENOSPC, "EDQUOT": errno.EDQUOT}


@register
class StorageFull(FaultKind):
    """The checkpoint storage is full: a save fails with ENOSPC (or EDQUOT) at a point of its write."""

    name = "storage_full"
    description = (
        "checkpoint saves fail with ENOSPC or EDQUOT at a point of their write for 'for_steps' steps; "
        "training goes on from the last committed checkpoint"
    )
    params: ClassVar[dict[str, Any]] = {"for_steps": None, "point": "shard", "errno": "ENOSPC"}
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {
        "for_steps": ("integer", "steps the storage stays full (absent: to the end)"),
        "point": (
            "|".join(FULL_AT),
            "where each save fails: every shard's first file, each shard halfway through its first "
            "file, the manifest, the rename that commits, or the fsync that makes the commit durable",
        ),
        "errno": ("ENOSPC|EDQUOT", "no space left on the device, or the quota exceeded"),
    }

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> Problems:
        """A step, a span, a point of a save and an errno; ``target: {rank: N}``, one rank's quota (its
        own shard only), or the shared storage."""
        rank = spec.target.get("rank") if set(spec.target) == {"rank"} else None
        problems = _window(replace(spec, target={}) if rank is not None else spec, facts, self.name)
        p = {**self.params, **spec.params}
        if rank is not None:
            if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < facts.world:
                problems.append((("target", "rank"), f"rank {rank!r}: give one of 0..{facts.world - 1}"))
            if not str(p["point"]).startswith("shard"):
                problems.append(
                    (
                        ("point",),
                        f"a rank's quota strikes its own shard, not the {p['point']}; write point: shard "
                        "or shard_mid, or target the shared storage",
                    )
                )
        if not one_of(p["point"], FULL_AT):
            problems.append((("point",), f"point {p['point']!r}: choose from {', '.join(FULL_AT)}"))
        if not one_of(p["errno"], FULL_ERRNOS):
            problems.append((("errno",), f"errno {p['errno']!r}: choose ENOSPC or EDQUOT"))
        return problems

    def plan(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> PlannedFault:
        """The span, the point and the errno (the defaults are left out of the plan, as before)."""
        params = {"for_steps": spec.params.get("for_steps")}
        params |= {
            k: spec.params[k]
            for k in ("point", "errno")
            if spec.params.get(k, self.params[k]) != self.params[k]
        }
        rank = int(spec.target.get("rank", -1))
        return PlannedFault(
            f"f{spec.index}-{self.name}", self.name, rank, int(spec.at["step"]), "boundary", params
        )

    def inject(self, injector: Injector, fault: PlannedFault) -> dict[str, Any]:
        """Fill the disk (at the start of every shard, by default: each rank's write refused), or one
        rank's quota (its shard only)."""
        point, code = self._where(fault)
        if fault.rank >= 0:
            injector.set_knob([fault.rank], "disk_full", f"{point}:{code}")
        elif (point, code) == ("shard", errno.ENOSPC):
            injector.set_knob(None, "storage_full", True)
        else:
            injector.fill_storage(point, code)
        return {"heal_step": heal_step(fault)}

    def heal(self, injector: Injector, fault: PlannedFault) -> None:
        """Space again."""
        if fault.rank >= 0:
            injector.set_knob([fault.rank], "disk_full", "")
        elif self._where(fault) == ("shard", errno.ENOSPC):
            injector.set_knob(None, "storage_full", False)
        else:
            injector.fill_storage(None)

    def _where(self, fault: PlannedFault) -> tuple[str, int]:
        p = {**self.params, **fault.params}
        return str(p["point"]), FULL_ERRNOS[str(p["errno"])]

    def effect(self, fired: dict[str, Any], evidence: Evidence) -> Effect:
        """The checkpoint writes that failed for want of space."""
        failed = [c["step"] for c in evidence.failed_writes_in(fired)]
        code = fired.get("params", {}).get("errno", "ENOSPC")
        if failed:
            return Effect(True, f"checkpoint(s) {', '.join(map(str, failed))} failed with {code}")
        return Effect(False, "no checkpoint was due while the storage was full")


@register
class CheckpointPause(FaultKind):
    """One rank's checkpoint write takes longer; the others wait for it in the next collective."""

    name = "checkpoint_pause"
    triggers = ()
    acts_on_checkpoint = True
    drill_order = 3
    description = "one rank's write of its checkpoint shard takes 'pause' longer (the others go on)"
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {
        "pause": ("seconds", "how much longer the rank's write of its shard takes"),
    }
    params: ClassVar[dict[str, Any]] = {"pause": "60s"}

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> Problems:
        """One rank, a checkpoint before the last step (the wait is in the step after it), a duration."""
        problems = _validate(spec, facts, self.name, need_after=True)
        pause = spec.params.get("pause", self.params["pause"])
        if parse_duration(pause) is None:
            problems.append((("pause",), f"pause must be a duration like 90 or '2m', got {pause!r}"))
        return problems

    def plan(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> PlannedFault:
        """The checkpoint's step and the pause in seconds."""
        step = checkpoint_step(int(spec.at["step"]), facts.checkpoint_every)
        pause = spec.params.get("pause", self.params["pause"])
        return PlannedFault(
            f"f{spec.index}-{self.name}",
            self.name,
            single_rank(spec, seed, facts),
            step,
            "checkpoint",
            {"pause_s": float(parse_duration(pause) or 0.0)},
        )

    def draw(self, draw: Any, facts: DrawFacts, rank: int) -> dict[str, Any]:
        """The rank's write of a checkpoint before the last step paused 30 s to 10 min."""
        step = draw(st.sampled_from(facts.checkpoints))
        return {**on_rank(self.name, rank, step), "pause": draw(st.sampled_from(["30s", "120s", "600s"]))}

    def inject(self, injector: Injector, fault: PlannedFault) -> dict[str, Any]:
        """The rank's write of this step's checkpoint will take the pause longer."""
        injector.pause_checkpoint(fault.rank, float(fault.params["pause_s"]))
        return {"checkpoint": fault.step, "pause_s": fault.params["pause_s"]}

    def heal(self, injector: Injector, fault: PlannedFault) -> None:
        """The pause is spent by the checkpoint it slowed."""

    def effect(self, fired: dict[str, Any], evidence: Evidence) -> Effect:
        """The rank's write of the checkpoint took the pause longer."""
        rank, step = str(fired.get("rank", -1)), int(fired.get("step", 0))
        for c in evidence.commits:
            if c["step"] >= step and rank in c.get("paused", {}):
                return Effect(
                    True, f"rank {rank}'s write of checkpoint {c['step']} took {c['paused'][rank]:g} s longer"
                )
        return Effect(False, f"no checkpoint was committed at or after step {step}{evidence.ended_early()}")
