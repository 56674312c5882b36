"""The serving checks and report on hand-made journals: each passes a good one and fails a bad one."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.report.check_result import FAIL, PASS, UNKNOWN
from testbed.report.serving_checks import (
    check_autoscaling,
    check_lost_requests,
    check_serving_latency,
    check_slo_attainment,
    check_tokens_identical,
)
from testbed.report.serving_report import loss_effects, render, serving_report
from testbed.scenario.expect import Expect

FIGURES = {
    "requests": 3,
    "completed": 3,
    "lost": 0,
    "tokens": 30,
    "makespan_s": 10.0,
    "ttft_p50_s": 0.2,
    "ttft_p99_s": 1.5,
    "tpot_p50_s": 0.02,
    "tpot_p99_s": 0.05,
    "latency_p99_s": 4.0,
    "slo_attainment": 2 / 3,
    "preemptions": 1,
    "moved": 1,
    "tokens_per_s": 3.0,
}


def end(rid: str, sha: str = "aa", status: str = "done", **kw: Any) -> dict[str, Any]:
    return {
        "event": "request_end",
        "request": rid,
        "status": status,
        "instance": "instance0",
        "tokens_sha": sha,
        "undisturbed_sha": "aa",
        "finish_s": kw.pop("finish_s", 5.0),
        "undisturbed_finish_s": kw.pop("undisturbed_finish_s", 5.0),
        **kw,
    }


def journal(*ends: dict[str, Any], **run: Any) -> list[dict[str, Any]]:
    start = {
        "event": "serve_start",
        "instances": {"instance0": 0, "instance1": 1},
        "policy": {"max_batch": 8, "kv_cap": 0.9, "preemption": "recompute", "prefill_tokens": 4096},
        "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
        "kv_blocks": 100,
    }
    figures = {**FIGURES, **run}
    return [start, *ends, {"event": "serve_end", "run": figures, "undisturbed": FIGURES}]


GOOD = journal(end("a"), end("b"), end("c"))


def test_lost_requests_passes_none_lost_and_fails_naming_the_kv_oom() -> None:
    assert check_lost_requests(GOOD, Expect(lost_requests=0)).status == PASS
    oom = {"request": "b", "tokens": 3041, "error": "KV cache full: request 'b' at 3041 tokens ..."}
    bad = journal(end("a"), end("b", status="failed", error=oom), lost=1, completed=2)
    result = check_lost_requests(bad, Expect(lost_requests=0))
    assert (
        result.status == FAIL
        and "b on instance0: KV cache full: request 'b' at 3041 tokens" in result.summary
    )
    assert check_lost_requests(bad, Expect(lost_requests=1)).status == PASS
    assert check_lost_requests(bad, Expect()).status == PASS  # no bound: reported, not judged


def test_serving_latency_fails_a_p99_over_its_bound() -> None:
    assert check_serving_latency(GOOD, Expect(ttft_p99_s=2.0, tpot_p99_s=0.1)).status == PASS
    over = check_serving_latency(GOOD, Expect(ttft_p99_s=1.0))
    assert over.status == FAIL and over.evidence["over"] == ["ttft_p99_s"]
    assert check_serving_latency(GOOD, Expect(tpot_p99_s=0.04)).status == FAIL


def test_slo_attainment_fails_below_its_bound() -> None:
    assert check_slo_attainment(GOOD, Expect(slo_attainment=0.6)).status == PASS
    assert check_slo_attainment(GOOD, Expect(slo_attainment=0.7)).status == FAIL


def test_tokens_identical_fails_on_one_output_that_differs() -> None:
    assert check_tokens_identical(GOOD, Expect()).status == PASS
    bad = journal(end("a"), end("b", sha="bb"), end("c"))
    result = check_tokens_identical(bad, Expect(tokens_identical=True))
    assert result.status == FAIL and result.evidence["differ"] == ["b"]


@pytest.mark.parametrize(
    ("check", "expect"),
    [
        (check_lost_requests, Expect(lost_requests=0)),
        (check_serving_latency, Expect(ttft_p99_s=1.0)),
        (check_slo_attainment, Expect(slo_attainment=0.5)),
        (check_tokens_identical, Expect(tokens_identical=True)),
    ],
)
def test_a_serving_run_that_did_not_end_is_unknown_when_bounded(check: Any, expect: Expect) -> None:
    crashed = [e for e in GOOD if e["event"] != "serve_end"]
    assert check(crashed, expect).status == UNKNOWN


def test_a_lost_instance_reports_its_spike_and_how_long_the_disturbance_lasted() -> None:
    lost = {"event": "instance_lost", "instance": "instance1", "at_s": 4.0, "detected_s": 6.0, "requests": 2}
    ends = [
        end("a", finish_s=3.0, undisturbed_finish_s=3.0),  # before the loss: not counted
        end("b", finish_s=9.0, undisturbed_finish_s=5.5),  # 3.5 s late
        end("c", finish_s=12.0, undisturbed_finish_s=11.95),  # late by less than a TPOT
    ]
    (effect,) = loss_effects([lost, *ends], tpot_s=0.1)
    assert effect["spike_s"] == pytest.approx(3.5) and effect["lasted_s"] == pytest.approx(5.0)
    report = serving_report([*journal(*ends), lost])
    assert report is not None
    text = "\n".join(render(report))
    assert "instance1 lost at 4 s, noticed at 6 s: 2 request(s) moved; latency spike 3.5 s" in text
    assert "TTFT p50" in text and "KV cache occupancy" in text and "tokens/s" in text


def autoscaling_event(instance_s: float) -> dict[str, Any]:
    fixed = {
        "min": {"instances": 1, "instance_s": 90.0, "slo_attainment": 0.47, "ttft_p99_s": 24.0},
        "max": {"instances": 4, "instance_s": 360.0, "slo_attainment": 1.0, "ttft_p99_s": 2.5},
    }
    return {
        "event": "autoscaling",
        "starts": 3,
        "stops": 3,
        "peak": 4,
        "instance_s": instance_s,
        "slo_attainment": 1.0,
        "fixed": fixed,
    }


def test_autoscaling_passes_a_run_cheaper_than_every_instance_throughout_and_fails_one_that_is_not() -> None:
    start = {**GOOD[0], "autoscaling": {"min_instances": 1, "scale_out_at": 12}}
    cheap = check_autoscaling([start, *GOOD[1:], autoscaling_event(190.0)], Expect())
    assert (
        cheap.status == PASS
        and "1 to 4 instances running (3 start(s), 3 stop(s)): 190 instance-s" in cheap.summary
    )
    assert "fixed at 4: 360 instance-s, 100.0%" in cheap.summary
    dear = check_autoscaling([start, *GOOD[1:], autoscaling_event(365.0)], Expect())
    assert dear.status == FAIL and "saved nothing: 365 instance-s against 360" in dear.summary
    assert check_autoscaling([start, *GOOD[1:]], Expect()).status == UNKNOWN  # the run did not end
    assert check_autoscaling(GOOD, Expect()).status == PASS  # not autoscaled
    report = serving_report([start, *GOOD[1:], autoscaling_event(190.0)])
    assert report is not None and any(line.startswith("  autoscaling: 1 to 4") for line in render(report))


def test_the_summary_sets_disaggregated_tails_beside_mixed_ones() -> None:
    tails = {"ttft_p99_s": 1.5, "tpot_p99_s": 0.0096}
    event = {
        "event": "disaggregation",
        "prefill": ["instance0"],
        "decode": ["instance1", "instance2"],
        "transfers": 118,
        "bytes": 9.4e9,
        "transfer_mean_s": 0.0004,
        "transfer_max_s": 0.0012,
        "disaggregated": tails,
        "mixed": {"ttft_p99_s": 0.8, "tpot_p99_s": 0.0154},
    }
    report = serving_report([*GOOD, event])
    assert report is not None
    (line,) = [x for x in render(report) if x.startswith("  disaggregated:")]
    assert "1 prefill + 2 decode instance(s); 118 KV transfer(s), 9.4 GB per NPU, mean 0.4 ms" in line
    assert "p99 TPOT 9.6 ms and TTFT 1.5 s against 15.4 ms and 0.8 s with every instance doing both" in line


def test_the_summary_adds_up_what_fragmented_activation_memory_cost() -> None:
    base = {"event": "serve_iteration", "instance": "instance0", "start_s": 1.0, "duration_s": 0.1}
    its = [
        {**base, "kv": {"occupancy": 0.1}, "interference": {"workspace_s": 0.004, "borrowed_bytes": 2e8}},
        {**base, "kv": {"occupancy": 0.1}, "interference": {"workspace_failed": 1.0}},
        {**base, "kv": {"occupancy": 0.1}},
    ]
    report = serving_report([*GOOD, *its])
    assert report is not None
    (line,) = [x for x in render(report) if x.startswith("  activation memory:")]
    assert (
        "2 pass(es) found no block for their workspace: 0.2 GB borrowed from the pool, 0 GB compacted" in line
    )
    assert "4 ms in all; 1 request(s) failed" in line
    assert not [x for x in render(serving_report(GOOD) or {}) if "activation memory" in x]
