"""How far the resumed run ended from the uninterrupted one, component by component.

Before the reference run starts, every rank keeps its final state of the
main run in host memory; after it, each rank measures, leaf by leaf, how its
final state differs from the kept one (:func:`testbed.train.rank_state.leaf_difference`).
The ``divergence`` event gathers them: per component, the largest absolute
and relative difference over the ranks, where it is (rank and leaf) and how
many leaves differ. A digest says only "differ"; this says by how much, and
in what: parameters that drifted by 1e-7 tell another story than an LR
scheduler ten steps behind or optimizer moments that restarted from zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from testbed.actors.cluster import Cluster
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
    cluster: Cluster, journal: Journal, ranks: list[int], reference: Callable[[], None]
) -> None:
    """Keep ``ranks``' final state, run ``reference``, and journal how the two differ."""
    cluster.call_ok("keep_final", ranks=ranks)
    reference()
    found = cluster.call_ok("difference_from_kept", ranks=ranks)
    journal.emit("divergence", phase="reference", components=gather(found))
