"""How far the resumed run ended from the uninterrupted one, component by component.

Before the reference run starts, every rank keeps its final state of the
main run in host memory; after it, each rank measures, leaf by leaf, how its
final state differs from the kept one (:func:`testbed.train.rank_state.leaf_difference`).
The ``divergence`` event gathers them: per component, the largest absolute
and relative difference over the ranks, where it is (rank and leaf) and how
many leaves differ. A digest says only "differ"; this says by how much, and
in what: parameters that drifted by 1e-7 tell another story than an LR
scheduler ten steps behind or optimizer moments that restarted from zero.
Runs that share their reference (a sweep's points) run it once
(:mod:`testbed.control.shared_reference`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from testbed.actors.cluster import Cluster
from testbed.control import shared_reference
from testbed.core.journal import Journal


def gather(by_rank: dict[int, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Each component's difference over all ranks: the largest ``max_abs`` (with its ``rank`` and
    ``leaf``), the largest ``max_rel``, ``leaves`` summed, ``mismatched`` leaves by rank."""
    out: dict[str, dict[str, Any]] = {}
    for rank, components in sorted(by_rank.items()):
        for name, d in components.items():
            c = out.setdefault(
                name,
                {"max_abs": 0.0, "max_rel": 0.0, "leaves": 0, "rank": None, "leaf": None, "mismatched": {}},
            )
            if d["leaves"] and (c["rank"] is None or d["max_abs"] > c["max_abs"]):
                c.update(max_abs=d["max_abs"], rank=rank, leaf=d["leaf"])
            c["max_rel"] = max(c["max_rel"], d["max_rel"])
            c["leaves"] += d["leaves"]
            if d["mismatched"]:
                c["mismatched"][str(rank)] = d["mismatched"]
    return dict(sorted(out.items()))


def against_reference(
    cluster: Cluster,
    journal: Journal,
    ranks: list[int],
    reference: Callable[[bool], int],
    key: str | None = None,
) -> None:
    """Keep ``ranks``' final state, run ``reference``, and journal how the two differ. A reference
    kept under ``key`` (:mod:`testbed.control.shared_reference`) is replayed instead of run:
    ``reference(True)`` then does only what the run itself needs of it. ``reference`` returns the
    group epoch the reference opened (or, replayed, would have)."""
    shared = shared_reference.kept(key)
    if shared is not None:
        epoch = reference(True)
        shared_reference.replay(journal, shared, epoch)
        found = cluster.call_ok("difference_from", ranks=ranks, per_rank=lambda r: (shared.finals[r],))
    else:
        cluster.call_ok("keep_final", ranks=ranks)
        start = len(journal.events)
        reference(False)
        found = cluster.call_ok("difference_from_kept", ranks=ranks)
        if key is not None and shared_reference.wanted(key):
            finals = cluster.call_ok("final_state", ranks=ranks)
            shared_reference.keep(key, journal.events[start:], finals)
    journal.emit("divergence", phase="reference", components=gather(found))
