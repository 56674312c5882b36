"""The parallel layout: rank <-> coordinates, groups, and topology-first placement."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from testbed.topology.layout import Coords, Layout, placement_warnings
from testbed.topology.presets import PRESETS, Topology

degrees = st.integers(1, 3)


@given(dp=degrees, tp=degrees, pp=degrees, ep=degrees)
def test_every_rank_has_one_place_and_each_group_partitions_the_ranks(
    dp: int, tp: int, pp: int, ep: int
) -> None:
    lay = Layout(dp=dp, tp=tp, pp=pp, ep=ep)
    assert [lay.rank_of(lay.coords(r)) for r in range(lay.world)] == list(range(lay.world))
    for axes in (("tp",), ("pp",), ("ep",), ("dp",), ("dp", "ep"), ("tp", "ep", "pp")):
        groups = {tuple(lay.group(r, axes)) for r in range(lay.world)}
        assert sorted(r for g in groups for r in g) == list(range(lay.world))
        for g in groups:
            assert len(g) == math.prod(lay.degree(a) for a in axes)
            others = [a for a in ("dp", "tp", "pp", "ep") if a not in axes]
            assert len({tuple(lay.coords(r).on(a) for a in others) for r in g}) == 1
        for r in range(lay.world):  # by definition: every rank that differs from r only along axes
            same = [
                q for q in range(lay.world) if all(lay.coords(q).on(a) == lay.coords(r).on(a) for a in others)
            ]
            assert lay.group(r, axes) == same


def test_tp_is_innermost_then_ep_then_pp_then_dp() -> None:
    lay = Layout(dp=2, tp=2, pp=2, ep=2)
    assert lay.group(0, ("tp",)) == [0, 1]
    assert lay.group(0, ("ep",)) == [0, 2]
    assert lay.group(0, ("pp",)) == [0, 4]
    assert lay.group(0, ("dp",)) == [0, 8]
    assert lay.coords(13) == Coords(dp=1, tp=1, pp=1, ep=0)
    assert lay.replicas == 4 and lay.describe() == "dp2 x tp2 x pp2 x ep2"


def test_only_tp_groups_that_span_supernodes_are_flagged() -> None:
    topo = Topology(PRESETS["atlas-900-a3"], 2, 4)
    assert placement_warnings(Layout(dp=2, tp=2, pp=2), topo) == []
    assert placement_warnings(Layout(dp=2, tp=4), topo) == []
    (warning,) = placement_warnings(Layout(tp=8), topo)
    assert "[0, 1, 2, 3, 4, 5, 6, 7]" in warning
    odd = placement_warnings(Layout(dp=2, tp=3), Topology(PRESETS["atlas-900-a3"], 3, 2))
    assert [w.split(" spans")[0] for w in odd] == ["TP group [0, 1, 2]", "TP group [3, 4, 5]"]
