"""Any single link fault on any collective: the right error reaches the right ranks, with the
right classification, and nothing hangs (ranks as threads over real sockets)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.collectives import OFFERED, Communicator
from testbed.core.errors import CollectiveTimeout, LinkSetupError, LinkSetupTimeout
from testbed.fabric.linkfaults import LinkFault, LinkFaultTable
from tests.fabric import run_group, topology

TOPO = topology(2, 2)
MEMBERS = [0, 1, 2, 3]
EXEC_S = 50.0


def program(collective: str, algo: str) -> Any:
    def run(c: Communicator) -> Any:
        buf = np.arange(64, dtype=np.float32) + c.rank
        if collective == "allreduce":
            return c.allreduce(buf, algo=algo)
        if collective == "reduce_scatter":
            return c.reduce_scatter(buf, algo=algo)
        if collective == "allgather":
            return c.allgather(buf[:16], algo=algo)
        if collective == "broadcast":
            return c.broadcast(buf, root=0, algo=algo)
        if collective == "reduce":
            return c.reduce(buf, root=0, algo=algo)
        return c.alltoall([buf[:8] + k for k in range(4)], algo=algo)

    return run


CASES = [
    (c, a)
    for c in ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "alltoall")
    for a in OFFERED[c]
]


def used_links(collective: str, algo: str) -> list[tuple[int, int]]:
    res = run_group(TOPO, MEMBERS, program(collective, algo))
    assert all(not isinstance(out, Exception) for out, _ in res.values())
    return sorted({(s, d) for _, ep in res.values() for (_, _, s, d) in ep.links_up})


def faulted(collective: str, algo: str, record: LinkFault, **kw: Any) -> dict[int, Any]:
    res = run_group(
        TOPO,
        MEMBERS,
        program(collective, algo),
        faults=LinkFaultTable((record,)),
        exec_timeout_s=EXEC_S,
        **kw,
    )
    return {r: out for r, (out, _) in res.items()}


def assert_only(outs: dict[int, Any], cls: type, direct: set[int]) -> None:
    """Ranks in ``direct`` raise ``cls`` themselves; every other rank succeeds or raises it by abort."""
    for r, out in outs.items():
        if r in direct:
            assert isinstance(out, cls) and out.how == "direct", (r, out)
        elif isinstance(out, Exception):
            assert isinstance(out, cls) and out.how == "abort", (r, out)


@settings(max_examples=40)
@given(case=st.sampled_from(CASES), pick=st.integers(0, 10**6))
def test_a_dropped_link_is_a_true_timeout_at_its_receiver(case: tuple[str, str], pick: int) -> None:
    links = used_links(*case)
    src, dst = links[pick % len(links)]
    outs = faulted(*case, LinkFault("f", "drop", src, dst))
    assert_only(outs, CollectiveTimeout, {dst})
    err = outs[dst]
    assert err.true_timeout is True and err.peer == src
    assert err.t == pytest.approx(err.wait_start + EXEC_S)
    assert all(o.true_timeout for o in outs.values() if isinstance(o, CollectiveTimeout))


@settings(max_examples=40)
@given(case=st.sampled_from(CASES), pick=st.integers(0, 10**6))
def test_a_slow_link_past_the_exec_timeout_is_a_false_timeout(case: tuple[str, str], pick: int) -> None:
    links = used_links(*case)
    src, dst = links[pick % len(links)]
    outs = faulted(*case, LinkFault("f", "degrade", src, dst, add_latency_s=2 * EXEC_S))
    assert_only(outs, CollectiveTimeout, {dst})
    assert outs[dst].true_timeout is False and outs[dst].peer == src
    assert "only slow" in str(outs[dst])


@settings(max_examples=30)
@given(case=st.sampled_from(CASES), pick=st.integers(0, 10**6))
def test_a_link_setup_past_the_connect_timeout_fails_both_ends(case: tuple[str, str], pick: int) -> None:
    links = used_links(*case)
    src, dst = links[pick % len(links)]
    outs = faulted(*case, LinkFault("f", "setup_delay", src, dst, setup_delay_s=500.0))
    assert_only(outs, LinkSetupTimeout, {src, dst})
    for r in (src, dst):
        assert outs[r].pair == [src, dst]
        assert "EI0006" in str(outs[r])


def test_a_slow_setup_inside_the_grace_window_only_costs_time() -> None:
    clean = run_group(TOPO, MEMBERS, program("allreduce", "ring"))
    slow = run_group(
        TOPO,
        MEMBERS,
        program("allreduce", "ring"),
        faults=LinkFaultTable((LinkFault("f", "setup_delay", 1, 2, setup_delay_s=100.0),)),
    )
    assert all(not isinstance(out, Exception) for out, _ in slow.values())
    t_clean = max(ep.clock.t for _, ep in clean.values())
    t_slow = max(ep.clock.t for _, ep in slow.values())
    assert t_slow == pytest.approx(t_clean + 100.0, abs=1.0)


@pytest.mark.parametrize(("collective", "algo"), CASES, ids=[f"{c}-{a}" for c, a in CASES])
def test_a_version_mismatch_fails_link_setup_naming_both_sides(collective: str, algo: str) -> None:
    outs = faulted(collective, algo, LinkFault("f", "version", 2, -1, version="HCCL 7.0.0"))
    direct = [r for r, o in outs.items() if isinstance(o, LinkSetupError) and o.how == "direct"]
    assert direct, outs
    for r in direct:
        err = outs[r]
        assert "EI0005" in str(err) and "HCCL 7.0.0" in str(err) and "HCCL 8.0.RC3" in str(err)
        assert 2 in err.pair
    assert_only(outs, LinkSetupError, set(direct))


def test_a_drop_window_that_has_ended_changes_nothing() -> None:
    outs = faulted("allreduce", "ring", LinkFault("f", "drop", 0, 1, t0=0.0, t1=1e-9))
    clean = run_group(TOPO, MEMBERS, program("allreduce", "ring"), exec_timeout_s=EXEC_S)
    for r, out in outs.items():
        np.testing.assert_array_equal(out, clean[r][0])


def test_drop_flap_and_degrade_windows() -> None:
    table = LinkFaultTable(
        (
            LinkFault("d", "drop", 0, 1, 10.0, 20.0),
            LinkFault("g", "degrade", 0, 1, 0.0, math.inf, bw_factor=0.5, add_latency_s=0.25),
        )
    )
    assert table.dropped(0, 1, 9.99) is None and table.dropped(0, 1, 10.0) is not None
    assert table.dropped(1, 0, 15.0) is None and table.dropped(0, 1, 20.0) is None
    assert table.degraded(0, 1, 5.0, seed=1, msg="m") == (0.5, 0.25)
    assert table.without("d").dropped(0, 1, 15.0) is None


def test_an_anchored_window_is_in_force_nowhere_until_a_rank_reaches_its_point() -> None:
    rec = LinkFault("f0-link_flap", "drop", 1, 2, 0.0, 2.0, anchor=(6, "grad_sync"))
    table = LinkFaultTable((rec, LinkFault("f1", "drop", 0, 1, 5.0, 6.0)))
    assert table.dropped(1, 2, 1.0) is None and table.anchors() == {(6, "grad_sync")}
    same, none = table.anchored_at(5, "grad_sync", 100.0)
    assert none == [] and same == table
    started, ids = table.anchored_at(6, "grad_sync", 100.0)
    assert ids == ["f0-link_flap"] and started.anchors() == set()
    assert started.dropped(1, 2, 99.9) is None and started.dropped(1, 2, 101.0) is not None
    assert started.dropped(1, 2, 102.0) is None and started.dropped(0, 1, 5.5) is not None


@pytest.mark.parametrize(
    ("at", "kind", "problem"),
    [
        ("{step: 3, during: allreduce}", "link_flap", None),
        ("{step: 3, during: tp}", "link_drop", None),
        ("{step: 3, during: backward}", "link_degrade", None),
        ("{step: 3, during: allreduce}", "link_setup_delay", "unknown trigger field 'during'"),
        ("{step: 3, during: optimizer}", "link_flap", "'during: optimizer' is not a point of a step"),
        ("{step: 0, during: forward}", "link_drop", "'during' needs a step of 1 or more"),
    ],
)
def test_link_faults_take_a_point_of_the_step(at: str, kind: str, problem: str | None) -> None:
    from testbed.core.errors import ScenarioError
    from testbed.scenario.parse import parse_scenario
    from tests.conftest import SCENARIOS

    text = (SCENARIOS / "link_flap_allreduce.yaml").read_text()
    text = text.replace("kind: link_flap", f"kind: {kind}").replace(
        "at: {step: 6, during: allreduce}", f"at: {at}"
    )
    if kind != "link_flap":
        text = text.replace("    down: 2s\n    up: 3s\n    cycles: 3\n", "")
    if problem is None:
        parse_scenario(text)
    else:
        with pytest.raises(ScenarioError, match=problem):
            parse_scenario(text)


def test_a_boundary_fault_over_before_the_jobs_first_message_is_warned_of_with_the_fix() -> None:
    from testbed.scenario.parse import parse_scenario
    from testbed.scenario.plan import missed_window_warnings
    from tests.conftest import SCENARIOS

    text = (SCENARIOS / "link_flap_allreduce.yaml").read_text()
    assert missed_window_warnings(parse_scenario(text)) == []  # during: allreduce meets it
    boundary = text.replace("at: {step: 6, during: allreduce}", "at: {step: 6}").replace(
        "cycles: 3", "cycles: 1"
    )
    (warning,) = missed_window_warnings(parse_scenario(boundary))
    assert "faults[0] link_flap on link 1<->2 is in force for 2 s from the boundary of step 6" in warning
    assert "the job computes 8.98 s before its first message on it (the gradient allreduce" in warning
    assert "Add 'during: allreduce'" in warning
    long = boundary.replace("down: 2s", "down: 20s")
    assert missed_window_warnings(parse_scenario(long)) == []  # long enough to meet the allreduce
    no_job = "\n".join(line for line in boundary.splitlines() if not line.startswith("job:"))
    assert missed_window_warnings(parse_scenario(no_job)) == []  # no step figures to judge by
