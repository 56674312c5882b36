"""The evidence a fault leaves in the journal, and the effect a fault kind reads from it.

A fault can be injected and change nothing: a degraded link that no
collective uses, a link-setup delay after every link is already up, a kill
armed for a point the rank never reaches, a full disk while no checkpoint is
due. Each fault kind says what its effect looks like in the journal
(:meth:`faults.kind.FaultKind.effect`), reading it through
:class:`Evidence`, and returns an :class:`Effect`: what it did, or why it did
nothing (:func:`faults.effects.fault_effects` asks every kind).

What the journal offers as evidence: ``fault_hits`` events (what each link
fault acted on, counted by the sending and receiving ranks themselves),
deaths (``failure_detected.killed``, with their step and point), the steps
each rank ran, checkpoints committed and failed, and every failure's errors.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from testbed.core.link_records import link_totals, step_ranks

Event = dict[str, Any]

#: how the summary names a point of a step
POINT_NAMES = {
    "boundary": "boundary",
    "step.start": "boundary",
    "forward": "forward",
    "backward": "backward",
    "allreduce.mid": "mid-allreduce",
    "shard.mid": "mid-checkpoint",
    "load.mid": "mid-load",
    "checkpoint": "checkpoint write",
    "checkpoint.committed": "checkpoint committed",
    "manifest.written": "mid-commit",
    "step.running": "mid-step",
    "recovery.relinked": "mid-recovery",
    "grad_sync": "gradient allreduce",
    "tp.start": "first TP collective",
    "pp.start": "first PP send/recv",
    "ep.start": "first EP all-to-all",
}


def point_text(point: str) -> str:
    """How a report names a point of a step (``mid-allreduce``)."""
    return POINT_NAMES.get(point, point)


@dataclass(frozen=True)
class Effect:
    """What a fault did (``took``), or why it did nothing (``how``), in a few words."""

    took: bool
    how: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"took": self.took, "how": self.how}


def ranks_text(ranks: Iterable[int]) -> str:
    """``rank 3`` or ``ranks 1,4``."""
    rs = sorted(set(ranks))
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ",".join(map(str, rs))


def links_text(links: Iterable[Iterable[int]], most: int = 4) -> str:
    """``3->4, 4->3`` (the first ``most``, then how many more); ``(r, -1)`` is rank r's stack."""
    pairs = [tuple(link) for link in links]
    shown = ", ".join(f"{a}->{b}" if b >= 0 else f"rank {a}" for a, b in pairs[:most])
    return shown + (f" and {len(pairs) - most} more" if len(pairs) > most else "")


class Evidence:
    """The main phase of a journal, indexed for the questions fault kinds ask of it."""

    def __init__(self, events: list[Event]) -> None:
        main = [e for e in events if e.get("phase") == "main"]
        self.events = main
        self._hits: dict[str, int] = {}
        for e in main:
            if e.get("event") == "fault_hits":
                for fault_id, n in e["hits"].items():
                    self._hits[fault_id] = self._hits.get(fault_id, 0) + int(n)
        self.steps = [e for e in main if e.get("event") == "step_end"]
        self.failures = [e for e in main if e.get("event") == "failure_detected"]
        self.job_failed = [e for e in events if e.get("event") == "job_failed"]
        self.commits = [e for e in main if e.get("event") == "checkpoint_committed"]
        self.failed_writes = [e for e in main if e.get("event") == "checkpoint_failed"]
        self.healed = {e["id"]: e for e in main if e.get("event") == "fault_healed"}

    def hits(self, fault_id: str) -> int:
        """How many messages and link set-ups the link fault ``fault_id`` acted on."""
        return self._hits.get(fault_id, 0)

    def deaths(self, ranks: Iterable[int], step: int | None = None, point: str | None = None) -> list[Event]:
        """The deaths of ``ranks`` (at ``step`` and ``point``, when given) the journal records."""
        wanted = set(ranks)
        return [
            d
            for f in self.failures
            for d in f.get("killed", [])
            if d["rank"] in wanted
            and (step is None or d.get("step") == step)
            and (point is None or d.get("point") == point)
        ]

    def window(self, fired: Event) -> tuple[int, int | None]:
        """The steps a fault was in force: from its step to the step it healed at (None: to the end)."""
        heal = fired.get("record", {}).get("heal_step")
        healed = self.healed.get(fired.get("id", ""))
        if healed is not None and "step" in healed:
            heal = healed["step"]
        return int(fired.get("step", 0)), None if heal is None else int(heal)

    def steps_in(self, fired: Event, ranks: Iterable[int] | None = None) -> list[Event]:
        """The steps run while ``fired`` was in force (by ``ranks``, when given)."""
        first, last = self.window(fired)
        wanted = None if ranks is None else {str(r) for r in ranks}
        return [
            e
            for e in self.steps
            if first <= e["step"]
            and (last is None or e["step"] < last)
            and (wanted is None or wanted & {str(r) for r in step_ranks(e)})
        ]

    def commits_in(self, fired: Event) -> list[Event]:
        """The checkpoints committed while ``fired`` was in force."""
        first, last = self.window(fired)
        return [e for e in self.commits if first <= e["step"] and (last is None or e["step"] < last)]

    def failed_writes_in(self, fired: Event) -> list[Event]:
        """The checkpoint writes that failed while ``fired`` was in force."""
        first, last = self.window(fired)
        return [e for e in self.failed_writes if first <= e["step"] and (last is None or e["step"] < last)]

    def links_used(self) -> set[tuple[int, int]]:
        """Every directed link a message arrived on in the main phase."""
        return {link for link, obs in link_totals(self.steps, self.events).items() if obs[0] > 0}

    def failed_with(self, error: str, rank: int) -> bool:
        """Whether ``rank`` itself raised an error named ``error`` (a failure, or the job's end)."""
        for f in self.failures:
            e = f.get("errors", {}).get(str(rank), {})
            if e.get("error") == error and e.get("how") == "direct":
                return True
        return any(j.get("error_type") == error and j.get("rank") == rank for j in self.job_failed)

    def ended_early(self) -> str:
        """`` (the job failed first)`` when the run did not finish the main phase, else nothing."""
        finished = any(e.get("event") == "phase_end" for e in self.events)
        return "" if finished else " (the job ended first)"


def slowed(fired: dict[str, Any], evidence: Evidence, what: str) -> Effect:
    """The effect of a fault that slows ranks down while it is in force: the steps they ran under it."""
    ranks = fired.get("params", {}).get("ranks") or [fired.get("rank", -1)]
    steps = evidence.steps_in(fired, ranks)
    if not steps:
        return Effect(
            False, f"no step of {ranks_text(ranks)} ran while it was in force{evidence.ended_early()}"
        )
    first, last = steps[0]["step"], steps[-1]["step"]
    span = f"step {first}" if first == last else f"steps {first}-{last}"
    return Effect(True, f"{what} {ranks_text(ranks)} in {len(steps)} step run(s) ({span})")
