"""The virtual clock follows its rules exactly (docs/collectives.md)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.fabric.clock import RankClock, link_setup_s
from testbed.topology.presets import PRESETS, LinkClass

LINK = LinkClass("intra", latency_s=1e-6, bandwidth_Bps=1e9)


def test_compute_charges_flops_over_rate() -> None:
    c = RankClock()
    c.compute(2e12, peak_flops=1e12, efficiency=0.5, slowdown=2.0)
    assert c.t == pytest.approx(8.0)
    assert c.compute_s == pytest.approx(8.0)


def test_send_occupies_egress_and_arrives_after_latency() -> None:
    c = RankClock(t=1.0)
    first = c.send(1000, LINK)
    assert first == pytest.approx(1.0 + 1e-6 + 1e-6)
    second = c.send(1000, LINK)  # queues behind the first on the egress
    assert second == pytest.approx(1.0 + 1e-6 + 2e-6)
    assert c.t == 1.0  # sending does not block the sender's program


def test_receive_waits_only_for_later_arrivals() -> None:
    c = RankClock(t=5.0)
    assert c.receive(4.0) == 0.0 and c.t == 5.0
    assert c.receive(7.5) == pytest.approx(2.5) and c.t == 7.5
    assert c.comm_wait_s == pytest.approx(2.5)


def test_the_ingress_takes_one_message_at_a_time_in_the_earliest_gap() -> None:
    c = RankClock()
    assert c.land(10.0, 2.0, src=1) == 10.0  # bytes in 8..10: the ingress was free
    assert c.land(10.0, 2.0, src=2) == 12.0  # a second sender's bytes at the same time: after the first's
    assert c.land(7.0, 1.0, src=3) == 7.0  # an earlier message fits in the gap before them
    assert c.land(8.5, 1.0, src=4) == 13.0  # one that would overlap waits for the first gap that holds it
    assert c.land(20.0, 0.0, src=5) == 20.0  # no bytes, no queue
    assert c.land(12.5, 2.0, src=2) == 15.0  # its own earlier message does not hold it up, rank 4's does
    assert c.land(13.0, 1.0, link="inter", src=6) == 13.0  # another class of link: another ingress


@settings(max_examples=50, deadline=None)
@given(
    sizes=st.lists(st.floats(0, 1e9), min_size=1, max_size=20),
    gaps=st.lists(st.floats(0, 1.0), min_size=20, max_size=20),
    latency=st.floats(0, 1e-3),
)
def test_one_sender_s_messages_never_queue_at_the_ingress(
    sizes: list[float], gaps: list[float], latency: float
) -> None:
    """Its egress already spaces them: the ingress changes nothing for a single sender (a ring)."""
    sender, receiver = RankClock(), RankClock()
    link = LinkClass("inter", latency_s=latency, bandwidth_Bps=1e9)
    for nbytes, gap in zip(sizes, gaps):
        sender.t += gap
        arrival = sender.send(nbytes, link)
        assert receiver.land(arrival, nbytes / link.bandwidth_Bps) == arrival  # exactly: journals keep


def test_link_setup_is_seeded_and_grows_with_load() -> None:
    model = PRESETS["atlas-900-a3"].link_setup
    key = (0, "world", "ring", 2, 3)
    a = link_setup_s(model, 1, key, links_at_once=8)
    assert a == link_setup_s(model, 1, key, links_at_once=8)
    assert a != link_setup_s(model, 2, key, links_at_once=8)
    assert a != link_setup_s(model, 1, (0, "world", "mesh", 2, 3), links_at_once=8)
    more = link_setup_s(model, 1, key, links_at_once=384)
    assert more - a == pytest.approx(model.per_concurrent_link_s * (384 - 8))
    assert model.base_s <= a <= model.base_s + model.jitter_s + model.per_concurrent_link_s * 8


def _reference_land(spans: list[tuple[float, float, int]], arrival: float, occupy: float, src: int) -> float:
    """The ingress rule written plainly: the earliest start at or after the bytes' own at which they
    overlap no other sender's span (touching within rounding is no overlap)."""
    start = arrival - occupy
    slack = 16 * math.ulp(arrival)
    moved = True
    while moved:
        moved = False
        for a, b, s in spans:
            if s != src and b > start + slack and a < start + occupy - slack:
                start, moved = b, True
    return arrival if start == arrival - occupy else start + occupy


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 5), st.integers(0, 4)), min_size=1, max_size=40))
def test_the_ingress_lands_each_message_as_the_plain_rule_says(
    messages: list[tuple[float, float, int]],
) -> None:
    clock, spans = RankClock(), []
    for arrival, occupy, src in messages:
        want = arrival if occupy <= 0 else _reference_land(spans, arrival, occupy, src)
        assert clock.land(arrival, occupy, "intra", src) == want
        if occupy > 0:
            spans.append((want - occupy, want, src))
