"""The hotspot diagnosis: from journalled steps alone it names the straggler or the degraded link,
says unknown when the evidence does not single one out, and never names a wrong culprit."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
