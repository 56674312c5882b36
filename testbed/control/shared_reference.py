"""One uninterrupted reference run for the runs of a sweep, a comparison or a suite that share it.

A run that recovered trains again from step 1, without faults, to say whether
it ended where it would have (the reference run). The points of a sweep over
the checkpoint interval, or the strategies of a comparison, differ only in what
that run never uses: the faults, the checkpoints, the recovery, what is
expected. Their references are one run (unless one strategy copies each
step's starting state to host memory to rerun it in place, which its
reference pays for too). Inside :func:`shared_references`, the
first run of a :func:`reference_key` runs its reference and keeps it (its
journal events and every rank's final state); each later run of that key
replays the events into its own journal and measures its own final state
against the kept one.

Runs are deterministic, so a replayed reference is the one the run would have
run: each journal is what the run gives alone, less its wall times
(``tests/test_shared_reference.py``). A reference that depends on more than
the scenario's text is never shared: learned timeouts (they learn from its
link setup), an integrity policy or silent corruptions (its skipped batches
follow the main run's rollbacks), preemption, a wall-time safeguard and
serving. The reference runs as a fresh, healthy job (``NPU.fresh_job``): its
links are set up as a new job's first epoch's, whatever epoch the main phase
reached, and no fault knob or wait of the main phase outlives the reset.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from testbed.core.journal import Journal
from testbed.recovery.registry import strategy
from testbed.scenario.model import Scenario

#: The scenario's parts a reference run never reads (the policy's own are :data:`UNREAD_POLICY`).
UNREAD = ("name", "description", "tags", "faults", "expect", "file", "warnings", "lines", "overrides")
UNREAD_POLICY = ("checkpoint", "recovery")
#: Fields :meth:`Journal.emit` stamps anew on a replayed event.
STAMPED = ("seq", "wall_s", "run")


@dataclass(frozen=True)
class KeptReference:
    """A reference run as a later run replays it: its journal events (as the journal holds them) and
    each rank's final state (component -> leaf -> array)."""

    events: tuple[dict[str, Any], ...]
    finals: dict[int, dict[str, dict[str, Any]]]


@dataclass
class _Shelf:
    kept: dict[str, KeptReference]
    only: frozenset[str] | None  # the keys worth keeping (None: all)


_SHELF: ContextVar[_Shelf | None] = ContextVar("shared_references", default=None)


@contextmanager
def shared_references(only: Collection[str] | None = None) -> Iterator[None]:
    """Inside the block, runs in this thread with the same :func:`reference_key` run one reference
    (``only``: keep only references of these keys, the others run as they would alone)."""
    token = _SHELF.set(_Shelf({}, None if only is None else frozenset(only)))
    try:
        yield
    finally:
        _SHELF.reset(token)


def repeated(scenarios: list[Scenario]) -> set[str]:
    """The keys that more than one of ``scenarios`` has, their reference run on all their ranks (what a
    suite keeps: a reference kept for no other run would only take memory)."""
    keys = [scenario_key(s, list(range(s.cluster.topology().world))) for s in scenarios]
    return {k for k in keys if k is not None and keys.count(k) > 1}


def reference_key(scenario: Scenario, ranks: list[int]) -> str | None:
    """:func:`scenario_key` inside :func:`shared_references`, else None."""
    return None if _SHELF.get() is None else scenario_key(scenario, ranks)


def scenario_key(scenario: Scenario, ranks: list[int]) -> str | None:
    """What ``scenario``'s reference run on ``ranks`` is a function of, as a digest; None when the
    reference depends on more than the scenario's text."""
    if not shareable(scenario):
        return None
    body = {k: v for k, v in scenario.as_dict().items() if k not in UNREAD}
    body["policy"] = {k: v for k, v in body["policy"].items() if k not in UNREAD_POLICY}
    # the one trait of the recovery a healthy run pays for: a strategy that reruns a step in place
    # copies each step's starting state to host memory, in the reference run too
    body["step_snapshot"] = strategy(scenario.policy.recovery.strategy).step_snapshot
    text = json.dumps([body, sorted(ranks)], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def shareable(scenario: Scenario) -> bool:
    """Whether ``scenario``'s reference run is a function of its text alone (see the module)."""
    policy = scenario.policy
    return not (
        policy.timeouts.learn is not None
        or policy.integrity is not None
        or policy.preemption is not None
        or scenario.safeguards.wall_s is not None
        or scenario.serves
        or scenario.corrupts_silently
    )


def kept(key: str | None) -> KeptReference | None:
    """The reference kept under ``key``, if one is."""
    shelf = _SHELF.get()
    return None if shelf is None or key is None else shelf.kept.get(key)


def wanted(key: str | None) -> bool:
    """Whether a reference run under ``key`` is to be kept (:func:`keep`)."""
    shelf = _SHELF.get()
    return shelf is not None and key is not None and (shelf.only is None or key in shelf.only)


def keep(key: str, events: list[dict[str, Any]], finals: dict[int, Any]) -> None:
    """Keep a reference run under ``key`` (call when :func:`wanted`)."""
    shelf = _SHELF.get()
    if shelf is not None:
        shelf.kept[key] = KeptReference(tuple(events), finals)


def replay(journal: Journal, reference: KeptReference, epoch: int) -> None:
    """Emit the kept reference's events into ``journal``, numbered and timed as this run's, its group
    opened as this run's ``epoch`` (a fresh job's link set-ups whatever the epoch's number)."""
    for event in reference.events:
        fields = {k: v for k, v in event.items() if k not in STAMPED and k != "event"}
        if event["event"] == "group_open":
            fields["epoch"] = epoch
        journal.emit(event["event"], **fields)
