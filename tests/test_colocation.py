"""Co-location: training's windows from its journal, what each takes from a serving instance, the
policy that shields it, and the check that holds the policy to the SLO."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.job.models import MODELS
from testbed.report.check_result import FAIL, PASS
from testbed.report.serving_checks import check_colocation
from testbed.scenario.expect import Expect
from testbed.serve.colocation import STAGING, Interference, Window, training_windows
from testbed.serve.cost import Deployment
from testbed.serve.fleet import Fleet
from testbed.serve.instance import BatchPolicy, Instance
from testbed.serve.kv_cache import PagedKVCache
from testbed.serve.proxy import ProxyModel
from testbed.serve.requests import Request
from testbed.topology.presets import PRESETS

A2 = PRESETS["atlas-800t-a2"]
DEP = Deployment(MODELS["llama3-8b"], A2, npus=8, tp=8)


def test_the_training_journal_gives_each_steps_allreduce_and_each_checkpoints_write() -> None:
    events = [
        {"event": "step_end", "phase": "main", "t": 10.0, "comm_wait_s": [0.5, 1.0]},
        {"event": "checkpoint_committed", "phase": "main", "t": 40.0, "write_s": 22.5},
        {"event": "step_end", "phase": "reference", "t": 99.0, "comm_wait_s": [1.0]},
        {"event": "step_end", "phase": "main", "t": 20.0, "comm_wait_s": [0.0]},
    ]
    assert training_windows(events) == (Window(9.0, 10.0, "allreduce"), Window(17.5, 40.0, "checkpoint"))


def test_an_allreduce_stretches_the_bytes_and_queues_each_hop_and_priority_undoes_it() -> None:
    busy = Interference((Window(0.0, 1.0, "allreduce"),), link_share=0.5, queue_bytes=2**20)
    hop = A2.intra.latency_s
    extra = busy.link_extra_s(0.5, latency_s=10 * hop, transfer_s=0.002, link=A2.intra)
    assert extra == pytest.approx(0.002 + 10 * 2**20 / A2.intra.bandwidth_Bps)
    assert busy.link_extra_s(1.5, 10 * hop, 0.002, A2.intra) == 0.0  # outside the window
    assert busy.under("priority").link_extra_s(0.5, 10 * hop, 0.002, A2.intra) == 0.0
    assert busy.under("none") == busy and busy.only("checkpoint").windows == ()


def _instance(interference: Interference) -> Instance:
    inst = Instance("i0", DEP, PagedKVCache(100, 16, 1), BatchPolicy(8), ProxyModel(1), 1)
    inst.interference = interference
    return inst


def test_a_checkpoints_staging_holds_kv_blocks_while_it_writes_and_requests_wait_for_room() -> None:
    staging = Interference((Window(1.0, 5.0, "checkpoint"),), staging_blocks=95)
    inst = _instance(staging)
    seen: list[dict[str, Any]] = []
    reqs = [Request("early", 0.0, 160, 40), Request("late", 1.5, 400, 8)]
    out = Fleet([inst], reqs, observe=lambda k, f: seen.append(f)).run()
    held = [f["interference"]["staging_blocks"] for f in seen if "interference" in f]
    # "early" is done by the write's start: the staging takes its 95 blocks, then gives them back
    assert held == [95] and STAGING not in inst.cache.holders()
    greedy = _instance(Interference((Window(0.5, 5.0, "checkpoint"),), staging_blocks=500))
    greedy.submit(Request("first", 0.0, 160, 400))
    greedy.iterate(0.0)  # before the write: "first" is admitted
    before = len(greedy.cache.table("first"))
    greedy.iterate(0.6)  # the write has begun: the staging takes what is free, no more
    assert len(greedy.cache.table(STAGING)) == 100 - before
    # "late" needs 26 blocks; while the staging holds all but a few it waits for the write's end
    assert out["late"].status == "done" and out["late"].times[0] >= 5.0
    alone = Fleet([_instance(Interference())], reqs).run()
    assert alone["late"].times[0] < 5.0 and alone["late"].tokens == out["late"].tokens


def _journal(run: dict[str, float], policy: str = "priority") -> list[dict[str, Any]]:
    base = {"ttft_p99_s": 0.1, "tpot_p99_s": 0.003, "itl_p99_s": 0.002, "latency_p99_s": 1.0}
    variants = {
        "alone": {**base, "slo_attainment": 1.0},
        "checkpoint": {**base, "ttft_p99_s": 20.0, "slo_attainment": 0.7},
        "allreduce": {**base, "tpot_p99_s": 0.008, "itl_p99_s": 0.01, "slo_attainment": 0.9},
        "both": {**base, "ttft_p99_s": 20.0, "tpot_p99_s": 0.008, "slo_attainment": 0.6},
        "policy": {**base, "slo_attainment": 1.0},
    }
    rise = {k: {m: variants[k][m] - base[m] for m in base} for k in ("checkpoint", "allreduce", "both")}
    return [
        {"event": "serve_start", "slo": {"ttft_s": 1.0, "tpot_s": 0.006}, "colocated": True},
        {"event": "serve_end", "run": run, "undisturbed": run},
        {"event": "colocation", "policy": policy, "variants": variants, "rise": rise, "windows": {}},
    ]


def test_the_colocation_check_passes_a_policy_that_keeps_the_slo_and_fails_one_that_does_not() -> None:
    kept = check_colocation(_journal({"ttft_p99_s": 0.1, "tpot_p99_s": 0.003}), Expect())
    assert kept.status == PASS
    assert "checkpoints raise serving's p99 TTFT by 19.9 s" in kept.summary
    assert "allreduces p99 TPOT by 5 ms" in kept.summary and "under priority 100.0%" in kept.summary
    broken = check_colocation(_journal({"ttft_p99_s": 20.0, "tpot_p99_s": 0.008}, "none"), Expect())
    assert broken.status == FAIL and "ttft_p99_s 20 s over the SLO's 1 s" in broken.summary
    assert check_colocation([{"event": "serve_start"}], Expect()).status == PASS  # serving alone


def test_a_straggler_and_a_degraded_link_slow_an_instance_only_in_their_windows() -> None:
    slow = Interference((Window(0.0, 1.0, "straggler", factor=3.0),))
    hop = A2.intra.latency_s
    assert slow.fault_extra_s(
        0.5, busy_s=0.01, latency_s=0.0, transfer_s=0.0, link=A2.intra
    ) == pytest.approx(0.02)
    assert slow.fault_extra_s(1.5, 0.01, 0.0, 0.0, A2.intra) == 0.0
    link = Interference((Window(0.0, 1.0, "link", factor=0.25, add_latency_s=1e-5),))
    extra = link.fault_extra_s(0.5, busy_s=0.01, latency_s=4 * hop, transfer_s=0.001, link=A2.intra)
    assert extra == pytest.approx(0.001 * 3 + 4 * 1e-5)
    reqs = [Request(f"q{k}", 0.1 * k, 200, 30) for k in range(6)]
    calm = Fleet([_instance(Interference())], reqs).run()
    slowed = Fleet([_instance(slow.with_windows(link.windows))], reqs).run()
    assert {k: o.tokens for k, o in slowed.items()} == {k: o.tokens for k, o in calm.items()}
    assert max(o.finish_s or 0 for o in slowed.values()) > max(o.finish_s or 0 for o in calm.values())


def test_serving_faults_fails_a_window_in_which_no_iteration_was_slowed() -> None:
    from testbed.report.serving_checks import check_serving_faults

    start = {"event": "serve_start", "kills": {}, "faults": {"instance0": [[5.0, None, "straggler"]]}}
    hit = {
        "event": "serve_iteration",
        "instance": "instance0",
        "start_s": 6.0,
        "interference": {"fault_s": 0.1},
    }
    early = {**hit, "start_s": 4.0}
    assert check_serving_faults([start, hit], Expect()).status == PASS
    missed = check_serving_faults([start, early], Expect())
    assert missed.status == FAIL and "straggler on instance0 from 5 s" in missed.summary
    kill = {"event": "serve_start", "kills": {"instance1": 3.0}}
    assert check_serving_faults([kill], Expect()).status == FAIL
    lost = {"event": "instance_lost", "instance": "instance1", "at_s": 3.0, "point": "decode"}
    assert check_serving_faults([kill, lost], Expect()).status == PASS
