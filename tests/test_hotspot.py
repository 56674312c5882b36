"""The hotspot diagnosis: from journalled steps alone it names the straggler or the degraded link,
says unknown when the evidence does not single one out, and never names a wrong culprit."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.core.link_records import queued_s
from testbed.fabric.linkfaults import LinkFault, LinkFaultTable
from testbed.report.hotspot import diagnose
from testbed.topology.layout import Layout
from tests.ranks import Job, on_all

Events = list[dict[str, Any]]
RATED = 1e-5  # a link's rated seconds per message in the synthetic journals


def step(n: int, compute: dict[int, float], links: dict[int, dict[int, list[float]]]) -> dict[str, Any]:
    ranks = sorted(compute)
    return {
        "event": "step_end",
        "phase": "main",
        "step": n,
        "compute_s": [compute[r] for r in ranks],
        "flops": [1e9 for _ in ranks],
        "links": {str(d): {str(s): obs for s, obs in by.items()} for d, by in links.items()},
    }


def ring_journal(slow_rank: int | None = None, slow_link: tuple[int, int] | None = None) -> Events:
    """Four ranks in a ring, 3 steps; one rank computes 2x slower, or one link carries at half speed."""
    events: Events = []
    for n in (1, 2, 3):
        compute = {r: (2.0 if r == slow_rank else 1.0) for r in range(4)}
        links: dict[int, dict[int, list[float]]] = {}
        for dst in range(4):
            src = (dst - 1) % 4
            transfer = 2 * RATED if (src, dst) == slow_link else RATED
            wait = 1.0 if src == slow_rank else (transfer - RATED) * 100
            links[dst] = {src: [1e6, transfer, RATED, wait, RATED / 2]}
        events.append(step(n, compute, links))
    return events


def as_large_world(events: Events) -> Events:
    """The same journal as a world of more than 64 ranks writes it: each step names its ranks and
    summarises its links; the links, added up over the phase, come once as ``link_totals``."""
    from testbed.control.steps import LinkTotals

    totals, out = LinkTotals(), []
    for e in events:
        e = dict(e)
        links = e.pop("links")
        e["ranks"], e["links_summary"] = sorted(int(r) for r in links), totals.add(links)
        out.append(e)
    out.append(
        {
            "event": "link_totals",
            "phase": "main",
            "links": {f"{s}->{d}": v for (s, d), v in totals.totals.items()},
        }
    )
    return out


@pytest.mark.parametrize("slow", [{"slow_rank": 2}, {"slow_link": (1, 2)}, {}])
def test_a_large_world_s_link_totals_give_the_same_diagnosis_as_every_step_s_links(slow: Any) -> None:
    per_step = ring_journal(**slow)
    summed = as_large_world(per_step)
    assert all("links" not in e for e in summed if e["event"] == "step_end")
    assert diagnose(summed).as_dict() == diagnose(per_step).as_dict()
    assert summed[0]["links_summary"]["links"] == 4 and summed[0]["links_summary"]["bytes"] == 4e6


def test_a_straggler_is_named_with_how_long_its_peers_waited_on_it() -> None:
    found = diagnose(ring_journal(slow_rank=2))
    assert (found.verdict, found.culprit) == ("straggler", 2)
    assert found.evidence["factor"] == 2.0 and found.evidence["peers_waited_s"] == 3.0
    assert "rank 2 is a straggler" in found.message


def test_a_degraded_link_is_named_with_its_receiver_s_wait() -> None:
    found = diagnose(ring_journal(slow_link=(1, 2)))
    assert (found.verdict, found.culprit) == ("link", [1, 2])
    assert found.evidence["directions"] == {"1->2": 3.0}  # the time beyond the latency: 1.5 / 0.5
    assert "rank 2 waited" in found.message


def test_a_healthy_run_has_no_hotspot() -> None:
    assert diagnose(ring_journal()).verdict == "none"


def test_two_stragglers_or_a_straggler_and_a_link_are_unknown_not_a_guess() -> None:
    two = ring_journal(slow_rank=2)
    for e in two:
        e["compute_s"][0] = 2.0
    found = diagnose(two)
    assert found.verdict == "unknown" and "rank 0" in found.message and "rank 2" in found.message
    both = ring_journal(slow_rank=2)
    for e, slow in zip(both, ring_journal(slow_link=(3, 0))):
        e["links"]["0"] = slow["links"]["0"]
    assert diagnose(both).verdict == "unknown"


def test_a_slight_deviation_is_unknown_rather_than_a_culprit() -> None:
    events = ring_journal()
    for e in events:
        e["compute_s"][1] = 1.1  # 10 % slower: below the threshold, above the noise
    found = diagnose(events)
    assert found.verdict == "unknown" and found.culprit is None


def test_without_measured_steps_the_diagnosis_is_unknown() -> None:
    events = [e for e in ring_journal() if e["step"] > 9]
    assert diagnose(events).verdict == "unknown"
    other = copy.deepcopy(ring_journal(slow_rank=1))
    assert diagnose(other, phase="reference").verdict == "unknown"


# --- the property: real collectives on threads, one fault drawn at random -----------------------

LAYOUTS = [Layout(dp=4), Layout(dp=2, tp=2), Layout(dp=2, pp=2), Layout(tp=2, pp=2), Layout(dp=2, tp=2, pp=2)]


def _events(outs: list[list[dict[str, Any]]]) -> Events:
    """``step_end`` events as the controller journals them, from each step's rank results."""
    events: Events = []
    for n, out in enumerate(outs, start=1):
        events.append(
            {
                "event": "step_end",
                "phase": "main",
                "step": n,
                "compute_s": [o["compute_s"] for o in out],
                "flops": [o["flops"] for o in out],
                "links": {str(o["rank"]): o["links"] for o in out},
            }
        )
    return events


def _run(job: Job, steps: int) -> list[list[dict[str, Any]]]:
    outs = []
    for n in range(1, steps + 1):
        out = job.step(n)
        for o in out:
            if isinstance(o, Exception):
                raise o
        outs.append(out)
    return outs


@settings(max_examples=10, deadline=None)
@given(
    layout=st.sampled_from(LAYOUTS),
    supernodes=st.sampled_from([1, 2]),
    straggler=st.booleans(),
    pick=st.integers(0, 10_000),
    factor=st.floats(1.5, 6.0),
    seed=st.integers(0, 2**16),
)
def test_any_single_straggler_or_degraded_link_is_named_or_unknown_never_wrong(
    layout: Layout, supernodes: int, straggler: bool, pick: int, factor: float, seed: int
) -> None:
    options = {"layers": 4, "hidden": 16, "ffn": 32, "batch": 8, "micro_batches": 2}
    with Job(layout, options, seed, supernodes=supernodes) as job:
        job.open()
        clean = _run(job, 1)
        used = sorted({(int(s), o["rank"]) for o in clean[0] for s in o["links"]})
        if straggler:
            culprit: Any = pick % layout.world
            job.npus[culprit].set_knob("slowdown", factor)
        else:
            src, dst = used[pick % len(used)]
            culprit = [min(src, dst), max(src, dst)]
            table = LinkFaultTable((LinkFault("f", "degrade", src, dst, bw_factor=1 / factor),))
            on_all(job.npus, "set_link_faults", table)
        found = diagnose(_events(_run(job, 3)[0:3]))
    assert found.verdict in ("straggler" if straggler else "link", "unknown"), found
    if found.verdict != "unknown":
        assert found.culprit == culprit, found.message


@pytest.mark.parametrize("straggler", [True, False])
def test_a_strong_fault_in_a_2x2x2_transformer_is_named(straggler: bool) -> None:
    layout = Layout(dp=2, tp=2, pp=2)
    with Job(layout, {"layers": 4, "hidden": 16, "ffn": 32, "batch": 8, "micro_batches": 2}, 3) as job:
        job.open()
        if straggler:
            job.npus[5].set_knob("slowdown", 3.0)
        else:
            on_all(
                job.npus, "set_link_faults", LinkFaultTable((LinkFault("f", "degrade", 0, 1, bw_factor=0.1),))
            )
        found = diagnose(_events(_run(job, 2)))
    assert (found.verdict, found.culprit) == (("straggler", 5) if straggler else ("link", [0, 1]))


# --- hotspots the traffic's layout makes by itself ------------------------------------------------


def test_an_incast_is_named_as_contention_at_the_receiver_not_as_a_bad_link() -> None:
    """Four ranks reduce to rank 0 over a mesh: three senders' bytes reach its ingress at once."""
    import numpy as np

    from tests.fabric import run_group
    from tests.test_collectives import one_node

    def reduce_twice(c: Any) -> dict[str, dict[str, list[float]]]:
        buf = np.ones(1 << 16, dtype=np.float32)
        c.reduce(buf, root=0, algo="mesh")  # sets the links up
        c.ep.clock.advance_to(1000.0)  # every rank starts the second together, egress idle
        c.ep.clock.egress_free = 1000.0
        c.ep.link_obs.clear()
        c.reduce(buf, root=0, algo="mesh")
        return {str(s): obs for s, obs in c.ep.link_obs.items()}

    res = run_group(one_node(4), [0, 1, 2, 3], reduce_twice)
    links = {str(r): out for r, (out, _) in res.items()}
    queued = sorted(queued_s(obs) for obs in links["0"].values())  # the root's three senders
    assert queued[0] == 0.0 and queued[1] > 0.0 and queued[2] == pytest.approx(2 * queued[1])
    event = {"event": "step_end", "phase": "main", "step": 1, "compute_s": [1.0] * 4, "flops": [1e9] * 4}
    found = diagnose([{**event, "links": links}])
    assert (found.verdict, found.culprit) == ("contention", [0]), found.message
    assert "rank 0's messages from 2, 3 queued" in found.message and "its senders: 1, 2, 3" in found.message
    assert "links are healthy" in found.message
    # the same journal without the queueing (no contention) has no hotspot
    calm = {d: {s: obs[:5] for s, obs in by.items()} for d, by in links.items()}
    assert diagnose([{**event, "links": calm}]).verdict == "none"


def _split_journal(cross_ratio: float, degraded: bool = False) -> Events:
    """A TP group of 4 over two supernodes ({0, 1} and {2, 3}) in a ring whose links 1->2 and 3->0
    cross: they carry each byte ``cross_ratio`` times as long as the links inside."""
    events: Events = [
        {
            "event": "placement",
            "split_tp_groups": [[0, 1, 2, 3]],
            "supernode_of": {"0": 0, "1": 0, "2": 1, "3": 1},
        }
    ]
    for n in (1, 2):
        links: dict[int, dict[int, list[float]]] = {}
        for dst in range(4):
            src = (dst - 1) % 4
            rated = RATED * (cross_ratio if (src, dst) in ((1, 2), (3, 0)) else 1.0)
            transfer = 3 * rated if degraded and (src, dst) == (1, 2) else rated
            links[dst] = {src: [1e6, transfer, rated, rated, rated / 2]}
        events.append(step(n, {r: 1.0 for r in range(4)}, links))
    return events


def test_a_split_tp_group_is_named_as_the_placement_with_the_links_it_crosses_on() -> None:
    found = diagnose(_split_journal(8.0))
    assert (found.verdict, found.culprit) == ("placement", [[0, 1, 2, 3]]), found.message
    assert "1->2, 3->0" in found.message and "8.0x as long per byte" in found.message
    assert found.evidence["groups"][0]["per_byte_ratio"] == 8.0


def test_a_split_group_whose_links_are_as_fast_across_is_no_hotspot_and_a_fault_still_wins() -> None:
    assert diagnose(_split_journal(1.1)).verdict == "none"  # within the threshold: nothing to name
    assert diagnose(_split_journal(8.0)[1:]).verdict == "none"  # no placement event: no split group
    degraded = diagnose(_split_journal(8.0, degraded=True))
    assert (degraded.verdict, degraded.culprit) == ("link", [1, 2])  # a fault is named before a layout


def test_a_tp_group_with_one_member_in_each_supernode_is_named_too() -> None:
    """TP 2 over two supernodes: no link inside one to compare with, every link of it across."""
    events: Events = [{"event": "placement", "split_tp_groups": [[0, 1]], "supernode_of": {"0": 0, "1": 1}}]
    links = {
        0: {1: [1e6, 8 * RATED, 8 * RATED, RATED, RATED / 2]},
        1: {0: [1e6, 8 * RATED, 8 * RATED, RATED, RATED / 2]},
    }
    events.append(step(1, {0: 1.0, 1: 1.0}, links))
    found = diagnose(events)
    assert (found.verdict, found.culprit) == ("placement", [[0, 1]]), found.message
    assert "0->1, 1->0" in found.message and "every one of its links across" in found.message


def _work_journal(flops: list[float], steps: int = 3, absent: int | None = None) -> Events:
    """Four ranks in a ring at rated speed, computing ``flops`` each per step at one rate (1 s per
    1e9); ``absent`` leaves that rank out of the first step (it joined later, as an elastic rank)."""
    events: Events = []
    for n in range(1, steps + 1):
        ranks = [r for r in range(4) if not (r == absent and n == 1)]
        links = {dst: {(dst - 1) % 4: [1e6, RATED, RATED, 0.0, RATED / 2]} for dst in ranks}
        e = step(
            n,
            {r: flops[r] / 1e9 for r in ranks},
            {d: {s: o for s, o in by.items() if s in ranks} for d, by in links.items()},
        )
        e["flops"] = [flops[r] for r in ranks]
        top = max(flops[r] for r in ranks) / 1e9
        e["comm_wait_s"] = [top - flops[r] / 1e9 for r in ranks]  # each waits for the busiest
        events.append(e)
    return events


def test_a_rank_given_most_of_the_work_is_named_as_the_imbalance_not_as_a_straggler() -> None:
    found = diagnose(_work_journal([4e9, 1e9, 1e9, 1e9]))
    assert (found.verdict, found.culprit) == ("imbalance", [0]), found.message
    assert "rank 0 computes 4.0x the median rank's FLOPs" in found.message
    assert "the others waited 9 s more in their collectives" in found.message  # 3 steps of 3 s
    assert "balance the work" in found.message
    # below the bar, even work, and even work by a rank present for fewer steps: no hotspot
    assert diagnose(_work_journal([1.4e9, 1e9, 1e9, 1e9])).verdict == "none"
    assert diagnose(_work_journal([1e9] * 4, absent=3)).verdict == "none"
    # a rank that is slower per FLOP is still a straggler, whatever its share of the work
    slow = _work_journal([1e9] * 4)
    for e in slow:
        e["compute_s"][2] *= 2
    assert (diagnose(slow).verdict, diagnose(slow).culprit) == ("straggler", 2)


def test_the_imbalance_judges_each_step_by_its_own_busy_ranks_and_needs_someone_waiting() -> None:
    # ranks 1-3 joined only for the last of three steps: by totals rank 0 would read 3x; by step, 1x
    late = _work_journal([1e9] * 4, steps=3)
    for e in late[:2]:
        e["links"] = {"0": {}}
        for key in ("compute_s", "flops", "comm_wait_s"):
            e[key] = e[key][:1]
    assert diagnose(late).verdict == "none", diagnose(late).message
    # two ranks that computed nothing in a step are no yardstick: [1e9, 1e9, 0, 0] is even work
    idle = _work_journal([1e9, 1e9, 1e9, 1e9])
    for e in idle:
        e["flops"][2:] = [0.0, 0.0]
        e["compute_s"][2:] = [0.0, 0.0]
    assert diagnose(idle).verdict == "none", diagnose(idle).message
    # a skew that no one waits for holds nothing up
    calm = _work_journal([4e9, 1e9, 1e9, 1e9])
    for e in calm:
        e["comm_wait_s"] = [0.0] * 4
    assert diagnose(calm).verdict == "none"


def test_a_straggler_with_less_than_its_share_of_the_work_is_still_the_straggler() -> None:
    uneven = _work_journal([2e9, 1e9, 1e9, 1e9])
    for e in uneven:
        e["compute_s"][3] *= 3  # rank 3 does the least and computes 3x slower per FLOP
    found = diagnose(uneven)
    assert (found.verdict, found.culprit) == ("straggler", 3), found.message
