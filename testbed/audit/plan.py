"""What a resume audit runs: the program, its ranks and steps, and where it is killed."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from testbed.core.errors import ScenarioError

#: every kill point, in the order of a step, with where exactly the rank dies
KILL_POINTS: dict[str, str] = {
    "before_forward": "at the start of the step, before forward_backward()",
    "after_backward": "after forward_backward() and gradients(), before the gradient reduction",
    "mid_reduction": "inside the gradient allreduce, between its reduce-scatter and its allgather (a "
    "step that only accumulates has none: the first reduction from that step on)",
    "after_step": "after optimizer_step(), before the step's checkpoint",
    "in_save": "inside the program's save() of the step's checkpoint: it is never committed",
    "after_save": "just after the step's checkpoint was saved by every rank and committed",
}

#: kill points that need a checkpoint saved at the end of their step
SAVE_POINTS = ("in_save", "after_save")


@dataclass(frozen=True)
class AuditPlan:
    """A resume audit: ``entry`` run on ``ranks`` data-parallel ranks for ``steps`` steps, a checkpoint
    every ``save_every`` steps, and one case per seed, kill point and kill step."""

    entry: str
    ranks: int = 2
    steps: int = 8
    kill_points: tuple[str, ...] = tuple(KILL_POINTS)
    #: the steps a rank is killed in (default: the middle step)
    kill_steps: tuple[int, ...] = ()
    seeds: tuple[int, ...] = (0,)
    save_every: int = 1
    #: the rank killed (default: the last)
    victim: int | None = None
    #: handed to the program's factory
    options: Mapping[str, Any] = field(default_factory=dict)
    #: FLOPs a step is charged on the virtual clock
    flops: float = 1e12
    #: wall seconds the program may go without a rank finishing a phase before it counts as hung
    timeout_s: float = 60.0
    #: run the uninterrupted run twice and refuse to judge a program whose two runs differ (off: a
    #: third fewer processes, and a non-deterministic program shows as divergences instead)
    twin_run: bool = True
    #: how rank processes start: ``zygote`` (forked from an interpreter that only imported numpy and
    #: PyTorch) or ``fresh`` (each a new interpreter: a second of CPU each with PyTorch)
    start: str = "zygote"

    def __post_init__(self) -> None:
        if not self.kill_steps:
            object.__setattr__(self, "kill_steps", (self.steps // 2,))
        if self.victim is None:
            object.__setattr__(self, "victim", self.ranks - 1)

    @property
    def victim_rank(self) -> int:
        """The rank killed."""
        return int(self.victim if self.victim is not None else self.ranks - 1)

    def saves_at(self, boundary: int) -> bool:
        """Whether a checkpoint is saved after ``boundary`` steps (never after the last)."""
        return 0 < boundary < self.steps and boundary % self.save_every == 0

    def problems(self) -> list[str]:
        """What makes the plan unusable, one message with its fix each."""
        out = []
        if not self.entry:
            out.append("name your program: a file path or a dotted module, then ':factory'")
        if not 1 <= self.ranks <= 16:
            out.append(f"ranks {self.ranks}: give 1 to 16 data-parallel ranks")
        if not 2 <= self.steps <= 10_000:
            out.append(f"steps {self.steps}: give 2 to 10000 steps")
        if self.save_every < 1:
            out.append(f"save_every {self.save_every}: give a positive number of steps")
        unknown = [p for p in self.kill_points if p not in KILL_POINTS]
        if unknown or not self.kill_points:
            out.append(f"kill points {', '.join(unknown) or '(none)'}: choose from {', '.join(KILL_POINTS)}")
        for s in self.kill_steps:
            if not 0 <= s < self.steps:
                out.append(f"kill step {s}: a step of the run is 0..{self.steps - 1}")
            elif any(p in SAVE_POINTS for p in self.kill_points) and not self.saves_at(s + 1):
                out.append(
                    f"kill step {s}: in_save and after_save need a checkpoint at the end of the step; "
                    f"with save_every {self.save_every} choose a step s with (s + 1) % {self.save_every} "
                    f"== 0 and s + 1 < {self.steps}"
                )
        if self.ranks >= 1 and not 0 <= self.victim_rank < self.ranks:
            out.append(f"victim rank {self.victim_rank}: a rank of the run is 0..{self.ranks - 1}")
        if not self.seeds or any(s < 0 for s in self.seeds):
            out.append("seeds: give one or more non-negative integers")
        if self.start not in ("zygote", "fresh"):
            out.append(f"start {self.start!r}: write zygote or fresh")
        if self.timeout_s <= 0:
            out.append(f"timeout_s {self.timeout_s}: give a positive number of seconds")
        return out

    def checked(self) -> AuditPlan:
        """This plan, or a :class:`ScenarioError` naming every problem."""
        found = self.problems()
        if found:
            raise ScenarioError("the audit cannot run: " + "; ".join(found), problems=found)
        return self

    def cases(self) -> list[tuple[int, str, int]]:
        """Every (seed, kill point, kill step), in the order they run."""
        return [(seed, p, s) for seed in self.seeds for p in self.kill_points for s in self.kill_steps]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, for the report."""
        return {**dataclasses.asdict(self), "options": dict(self.options)}
