"""Learned timeouts, after nvidia-resiliency-ext's fault-tolerance recipe.

Per phase of the job (``setup``: a group's link setup; ``step``: one
training step; ``checkpoint``: one checkpoint's hold on training) the
learner keeps the largest interval any rank was seen to take. Its timeout is
that interval times a safety factor (default 5), blended 50/50 with the
value saved before (in the checkpoint the job resumed from), and never below
the largest interval seen. Until a phase has enough samples, the saved value
(if any) stands.

What is not learned from, because it would teach a value too tight for the
cases it does not cover: the first ``warmup_steps`` steps after a start or a
restart (lazy link setup, cold caches); the setup of a group after an
in-memory restore, an elastic shrink or a rejoin (a cold start is slower);
the hold of an asynchronous checkpoint (only its snapshot: a synchronous
write takes longer). ``step`` needs ``min_samples`` samples; ``setup`` and
``checkpoint``, rare by nature, need one.

The step timeout, once learned, is a detector: a step that has not ended
``step`` seconds after it began is declared failed (a watchdog on iteration
time), which finds a hung or dead rank in about safety factor x step time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from testbed.scenario.model import LearnPolicy

PHASES = ("setup", "step", "checkpoint")


@dataclass
class Learner:
    """What has been seen so far, and what was saved before."""

    policy: LearnPolicy
    saved: dict[str, float] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)
    samples: dict[str, int] = field(default_factory=dict)

    def observe(self, phase: str, interval: float) -> None:
        """One interval of ``phase`` (the longest over the ranks)."""
        self.seen[phase] = max(self.seen.get(phase, 0.0), interval)
        self.samples[phase] = self.samples.get(phase, 0) + 1

    def needed(self, phase: str) -> int:
        """Samples ``phase`` needs before its own value counts."""
        return self.policy.min_samples if phase == "step" else 1

    def timeout(self, phase: str) -> float | None:
        """The timeout of ``phase`` now: learned and blended, the saved one, or None."""
        if self.samples.get(phase, 0) < self.needed(phase):
            return self.saved.get(phase)
        seen = self.seen[phase]
        new = seen * self.policy.safety_factor
        before = self.saved.get(phase)
        value = new if before is None else self.policy.blend * before + (1 - self.policy.blend) * new
        return max(value, seen)

    def values(self) -> dict[str, float]:
        """Every phase's timeout that exists now (what a checkpoint saves)."""
        out = {p: self.timeout(p) for p in PHASES}
        return {p: v for p, v in out.items() if v is not None}

    def resumed(self, saved: dict[str, Any] | None) -> Learner:
        """A fresh learner after a restart from a checkpoint that saved ``saved``."""
        return Learner(self.policy, {p: float(v) for p, v in (saved or {}).items() if p in PHASES})
