"""The audit's judgement: pure functions of the leaves the ranks reported, step by step.

A leaf is ``[digest, value]`` (the value only when small). A case passes when
every leaf of every rank equals the uninterrupted run's at every step
boundary from the resume on. Otherwise it names the first leaf that differs
(ranks in order, leaves in the program's order) and when: right after the
load (the save or the load misses that state) or only later (the state was
restored, then something outside every Stateful made it diverge).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Leaves = Mapping[str, Any]
#: boundary (steps done) -> rank -> leaves
ByBoundary = Mapping[int, Mapping[int, Leaves]]

#: when a divergence was first seen, and what that says about the program
WHEN = {
    "after_load": "differed right after load: the program's save or load misses this state",
    "later": "equal right after load, diverged later: state outside every Stateful (a global "
    "generator, a module-level counter, an attribute its state_dict() leaves out)",
    "before_kill": "differed before any kill: the program is not the same run twice",
}


@dataclass(frozen=True)
class Divergence:
    """The first leaf that differs from the uninterrupted run."""

    boundary: int
    rank: int
    leaf: str
    got: Any
    reference: Any
    when: str

    @property
    def component(self) -> str:
        """The Stateful the leaf belongs to (``rng`` for a global generator)."""
        return self.leaf.split(".", 1)[0]

    def values(self) -> str:
        """``27 != 20`` (this run's value, then the uninterrupted run's) when both are small."""
        if self.got is None and self.reference is None:
            return "values differ"
        return f"{_show(self.got)} != {_show(self.reference)}"

    def describe(self) -> str:
        """One line: which leaf, where, both values, and what it says."""
        return (
            f"{self.component}: {self.leaf} {self.values()} (this run vs uninterrupted) at step "
            f"{self.boundary} on rank {self.rank}; {WHEN[self.when]}"
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "boundary": self.boundary,
            "rank": self.rank,
            "leaf": self.leaf,
            "component": self.component,
            "got": self.got,
            "reference": self.reference,
            "when": self.when,
        }


def _show(value: Any) -> str:
    if value is None:
        return "(large)"
    if value == "(absent)":
        return "absent"
    return repr(value) if isinstance(value, str) else str(value)


def first_leaf(
    reference: Mapping[int, Leaves], got: Mapping[int, Leaves]
) -> tuple[int, str, Any, Any] | None:
    """The first (rank, leaf, got value, reference value) whose digest differs; None if all equal.
    Only the ranks ``got`` has are compared (a rank killed before it reported has nothing to say);
    a leaf on one side only differs (its value is shown as absent on the other)."""
    for rank in sorted(got, key=int):
        ref, now = reference.get(rank, {}), got.get(rank, {})
        for name in [*ref, *(n for n in now if n not in ref)]:
            a, b = ref.get(name), now.get(name)
            if a is None or b is None or a[0] != b[0]:
                return (
                    int(rank),
                    name,
                    "(absent)" if b is None else b[1],
                    "(absent)" if a is None else a[1],
                )
    return None


def first_divergence(reference: ByBoundary, got: ByBoundary, when: str) -> Divergence | None:
    """The first boundary (in order) of ``got`` at which any leaf differs from ``reference``."""
    for boundary in sorted(got, key=int):
        found = first_leaf(reference.get(boundary, {}), got[boundary])
        if found is not None:
            rank, leaf, value, ref_value = found
            return Divergence(int(boundary), rank, leaf, value, ref_value, when)
    return None


@dataclass(frozen=True)
class Verdict:
    """A case's outcome: ``pass``, ``diverged`` (with the divergence) or ``undecided`` (why)."""

    status: str
    divergence: Divergence | None = None
    why: str = ""

    def describe(self) -> str:
        """One line for the table."""
        if self.divergence is not None:
            return self.divergence.describe()
        return self.why or "every leaf equal to the uninterrupted run at every step"


def judge(
    reference: ByBoundary,
    before_kill: ByBoundary,
    resumed_at: int | None,
    loaded: Mapping[int, Leaves],
    resumed: ByBoundary,
) -> Verdict:
    """Judge one case against the uninterrupted run: its stretch up to the kill, the leaves right
    after the load at ``resumed_at`` (None: no checkpoint yet, a restart from scratch), and the
    resumed stretch's boundaries."""
    early = first_divergence(reference, before_kill, "before_kill")
    if early is not None:
        return Verdict("undecided", early, "the stretch before the kill already differs")
    if resumed_at is not None:
        at_load = first_divergence(reference, {resumed_at: loaded}, "after_load")
        if at_load is not None:
            return Verdict("diverged", at_load)
    later = first_divergence(reference, resumed, "later")
    if later is not None:
        return Verdict("diverged", later)
    if not resumed:
        return Verdict("undecided", why="the resumed run reported no step")
    return Verdict("pass")
