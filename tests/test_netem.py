"""``link_netem``: validation, the time model and its seeded draws, the real data path (checksum,
sequence numbers) over real sockets, and whole runs that match (or, without a checksum, miss) the
uninterrupted run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from testbed.cli import main
from testbed.collectives import Communicator
from testbed.core.errors import ScenarioError
from testbed.core.seeding import stream
from testbed.core.units import parse_rate
from testbed.fabric.linkfaults import LinkFault, LinkFaultTable
from testbed.fabric.netem import RDMA_RTO_S, RETRY_CNT, Netem, NetemLink
from testbed.scenario.parse import load_scenario, parse_scenario
from testbed.scenario.plan import make_plan
from tests.conftest import SCENARIOS
from tests.fabric import run_group, topology

BASE = """\
version: 1
name: t
seed: 3
cluster: {preset: atlas-800t-a2, supernodes: 2, npus_per_supernode: 2}
workload: {name: mlp, steps: 8, parallel: {dp: 4}, hidden: 16}
faults:
  - kind: link_netem
    target: {link: [1, 2]}
    at: {step: 2}
"""


def problems(extra: str) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(BASE + extra, "s.yaml")
    return info.value.problems  # type: ignore[attr-defined,no-any-return]


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        ("    loss: 1.5\n", ("faults[0].loss", "fraction of the messages in [0, 1]", "1.5")),
        ("    loss: 1\n", ("faults[0].loss", "use link_drop")),
        ("    delay: -5\n", ("faults[0].delay", "not a duration", "'30s'")),
        ("    loss: 0.1\n    flavour: x\n", ("flavour",)),
        ("    rate: 0\n", ("faults[0].rate", "above zero", "10gbit")),
        ("    rate: 1gbps\n", ("faults[0].rate", "ambiguous", "1GB/s")),
        ("    rate: fast\n", ("faults[0].rate", "1.25GB/s")),
        ("    loss: 0.1\n    correlation: 1\n", ("faults[0].correlation", "[0, 1)")),
        ("    loss: 0.1\n    gap: 0\n", ("faults[0].gap", "at least 1")),
        ("    corrupt: 0.1\n    checksum: maybe\n", ("faults[0].checksum", "true or false")),
        ("    direction: sideways\n    loss: 0.1\n", ("faults[0].direction", "both or one")),
        ("", ("does nothing", "loss, delay")),
    ],
)
def test_bad_values_name_the_field_and_the_fix(extra: str, needles: tuple[str, ...]) -> None:
    found = problems(extra)
    assert any(all(n in p for n in needles) for p in found), found


def test_validate_exits_254_on_a_bad_netem_entry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE + "    loss: 1.5\n    rate: 0\n")
    assert main(["validate", str(bad)]) == 254
    err = capsys.readouterr().err
    assert "loss is a fraction" in err and "rate must be a bandwidth" in err
    good = tmp_path / "good.yaml"
    good.write_text(BASE + "    loss: 0.05\n    rate: 1.25GB/s\n    delay: 50us\n")
    assert main(["validate", str(good)]) == 0


def test_rates_parse_in_bits_and_bytes() -> None:
    assert parse_rate("10Gbit/s") == parse_rate("10gbit") == parse_rate("1.25GB/s") == 1.25e9
    assert parse_rate("100MiB/s") == 100 * 2**20 and parse_rate(5e8) == 5e8
    assert (
        parse_rate(0) is None
        and parse_rate("0gbit") is None
        and parse_rate("10Gbps") is None
        and parse_rate("fast") is None
    )


def test_the_plan_resolves_links_durations_and_the_rate() -> None:
    s = parse_scenario(
        BASE + "    loss: 0.1\n    delay: 2ms\n    rate: 10gbit\n    direction: one\n", "s.yaml"
    )
    (f,) = make_plan(s)
    assert f.params["links"] == [[1, 2]] and f.params["delay"] == pytest.approx(0.002)
    assert f.params["rate_Bps"] == 1.25e9 and f.params["retransmit_timeout"] == RDMA_RTO_S


# --- the time model ----------------------------------------------------------------------------


def test_rate_delay_and_jitter_follow_netems_formulas() -> None:
    link = NetemLink(1, "f", 0, 1)
    n = Netem(delay_s=1e-3, jitter_s=4e-4, rate_Bps=1e9)
    tx = link.transmit(n, 10.0, 5e-6, 25e9, 1e6, 1.0)
    assert tx.occupy == pytest.approx(1e6 / 1e9)  # min(rated 25 GB/s, rate 1 GB/s)
    u = float(stream(1, "netem", "f", 0, 1).random())
    assert tx.latency == pytest.approx(5e-6 + 1e-3 + 4e-4 * (2 * u - 1))
    assert tx.arrival == pytest.approx(10.0 + tx.latency + tx.occupy) and tx.egress_free == 10.0 + tx.occupy
    spread = [NetemLink(s, "f", 0, 1).transmit(n, 0.0, 0.0, 1e12, 0.0, 1.0).latency for s in range(200)]
    assert 6e-4 <= min(spread) < 6.2e-4 and 1.38e-3 < max(spread) <= 1.4e-3  # uniform in delay ± jitter


def test_correlated_draws_follow_netems_recurrence() -> None:
    link, fresh = NetemLink(5, "f", 2, 3), stream(5, "netem", "f", 2, 3)
    prev = float(fresh.random())
    assert link.draw("loss", 0.25) == prev
    for _ in range(5):
        want = 0.25 * prev + 0.75 * float(fresh.random())
        assert link.draw("loss", 0.25) == pytest.approx(want)
        prev = want


def test_each_loss_costs_a_retransmit_timeout_and_a_corruption_a_round_trip() -> None:
    lossy = [
        NetemLink(s, "f", 0, 1).transmit(Netem(loss=0.5, rto_s=2.0), 0.0, 1e-3, 1e9, 1e6, 1.0)
        for s in range(50)
    ]
    for tx in lossy:
        assert tx.retransmit_s == pytest.approx(2.0 * len(tx.failed))
        assert tx.arrival == pytest.approx(tx.retransmit_s + 1e-3 + 1e-3)
    assert sum(len(tx.failed) for tx in lossy) > 20
    bad = [NetemLink(s, "f", 0, 1).transmit(Netem(corrupt=0.5), 0.0, 1e-3, 1e9, 1e6, 1.0) for s in range(50)]
    assert all(tx.retransmit_s == pytest.approx(len(tx.failed) * (1e-3 + 2e-3)) for tx in bad)
    assert any(tx.failed for tx in bad) and not any(tx.corrupt for tx in bad)  # the checksum caught them
    silent = [
        NetemLink(s, "f", 0, 1).transmit(Netem(corrupt=0.5, checksum=False), 0, 1e-3, 1e9, 1e6, 1)
        for s in range(50)
    ]
    assert any(tx.corrupt for tx in silent) and not any(tx.failed for tx in silent)


def test_the_link_gives_up_after_the_retry_count() -> None:
    tx = NetemLink(0, "f", 0, 1).transmit(Netem(loss=0.999999), 0.0, 1e-6, 1e9, 1e3, 1.0)
    assert tx.given_up and len(tx.failed) == RETRY_CNT + 1


def test_duplicates_occupy_the_egress_and_reordering_holds_gap_messages() -> None:
    dup = NetemLink(0, "f", 0, 1).transmit(Netem(duplicate=0.999999), 0.0, 0.0, 1e9, 1e6, 1.0)
    assert dup.duplicate and dup.egress_free == pytest.approx(2e-3)
    link, n = NetemLink(0, "f", 0, 1), Netem(reorder=0.999999, gap=3)
    held = [link.transmit(n, 0.0, 0.0, 1e9, 1e6, 1.0).held_s for _ in range(6)]
    assert held == pytest.approx([0, 0, 3e-3, 0, 0, 3e-3])  # every gap-th message, netem's counter


# --- the data path over real sockets ------------------------------------------------------------


def allreduce(c: Communicator) -> Any:
    out = []
    for k in range(6):
        out.append(c.allreduce(np.arange(256, dtype=np.float32) * (k + 1) + c.rank, algo="ring"))
    return np.concatenate(out), c.ep.clock.t


def netem_run(netem: Netem | None) -> dict[int, tuple[Any, Any]]:
    table = LinkFaultTable(
        ()
        if netem is None
        else (LinkFault("f", "netem", 1, 2, netem=netem), LinkFault("f", "netem", 2, 1, netem=netem))
    )
    res = run_group(topology(2, 2, "atlas-800t-a2"), [0, 1, 2, 3], allreduce, faults=table)
    assert all(not isinstance(out, Exception) for out, _ in res.values()), res
    return res


def hits(res: dict[int, tuple[Any, Any]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for _, ep in res.values():
        for k, v in ep.fault_hits.items():
            total[k] = total.get(k, 0) + v
    return total


NOISY = Netem(
    loss=0.2, corrupt=0.2, duplicate=0.3, reorder=0.2, gap=2, delay_s=1e-4, jitter_s=5e-5, rto_s=0.5
)


def test_loss_corruption_and_duplicates_cost_time_but_deliver_the_same_data() -> None:
    clean, noisy = netem_run(None), netem_run(NOISY)
    for r in clean:
        assert np.array_equal(clean[r][0][0], noisy[r][0][0])  # bit for bit
    h = hits(noisy)
    assert h["f.lost"] > 0 and h["f.corrupted"] > 0 and h["f.duplicated"] > 0
    assert h["f.caught"] == h["f.corrupted"]  # every corrupted copy really arrived and failed its CRC
    # every duplicate really arrived and was turned away, but one after the link's very last message,
    # which nothing reads any more
    assert h["f.duplicated"] - 1 <= h["f.discarded"] <= h["f.duplicated"]
    assert h["f.retransmits"] == h["f.lost"] + h["f.corrupted"]
    assert h["f.retransmit_us"] >= h["f.lost"] * 0.5e6
    assert max(t for (_, t), _ in noisy.values()) > max(t for (_, t), _ in clean.values()) + 0.5


def test_the_same_seed_gives_the_same_counts_and_times() -> None:
    a, b = netem_run(NOISY), netem_run(NOISY)
    assert hits(a) == hits(b)
    assert {r: out[1] for r, (out, _) in a.items()} == {r: out[1] for r, (out, _) in b.items()}


def test_without_a_checksum_corruption_changes_the_data_that_arrives() -> None:
    clean = netem_run(None)
    silent = netem_run(Netem(corrupt=0.5, checksum=False))
    h = hits(silent)
    assert h["f.corrupted"] > 0 and "f.caught" not in h and "f.retransmits" not in h
    assert any(not np.array_equal(clean[r][0][0], silent[r][0][0]) for r in clean)


# --- whole runs --------------------------------------------------------------------------------


@pytest.mark.ray
def test_the_lossy_link_scenario_counts_its_retransmits_and_matches_the_uninterrupted_run(
    testbed_run: Any,
) -> None:
    report = testbed_run(load_scenario(SCENARIOS / "lossy_link.yaml"))
    assert report.verdict == "pass", report.summary()
    (row,) = report.data["netem"]
    assert row["lost"] > 0 and row["retransmits"] == row["lost"] + row["caught"]
    assert row["retransmit_s"] == pytest.approx(row["lost"] * RDMA_RTO_S, abs=0.01)  # corrupt: ~0.1 ms each
    assert (
        row["caught"] == row["corrupted"] and row["duplicated"] - 2 <= row["discarded"] <= row["duplicated"]
    )
    check = report.check("matches_uninterrupted")
    assert check.status == "pass" and "equal the uninterrupted run's" in check.summary
    assert "netem f0-link_netem:" in report.summary() and "retransmit(s) cost" in report.summary()
    effects = [e for e in report.events() if e["event"] == "fault_effects"]
    assert effects and effects[0]["effects"]["f0-link_netem"]["took"] is True


@pytest.mark.ray
def test_without_a_checksum_the_run_diverges_from_the_uninterrupted_one(testbed_run: Any) -> None:
    text = (
        (SCENARIOS / "lossy_link.yaml")
        .read_text()
        .replace("    corrupt: 0.03\n", "    corrupt: 0.2\n    checksum: false\n")
    )
    report = testbed_run(parse_scenario(text, "silent.yaml"))
    (row,) = report.data["netem"]
    assert row["corrupted"] > 0 and row["caught"] == 0 and row["delivered_corrupt"] == row["corrupted"]
    check = report.check("matches_uninterrupted")
    assert check.status == "fail" and "differ" in check.summary
    assert report.verdict == "fail"
