"""The virtual clock follows DESIGN 4.1 exactly."""

from __future__ import annotations

import pytest

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
