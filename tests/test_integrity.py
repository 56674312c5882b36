"""Silent data corruption without Ray: the corruption itself, the detectors, the checks on journals
made by hand (each shown to fail on a bad one), retention, goodput, and bad input refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from testbed.core.errors import ScenarioError
from testbed.integrity.detectors import replica_groups, validate, vote
from testbed.report.checks import run_checks
from testbed.report.goodput import goodput
from testbed.report.integrity_checks import (
    check_no_poisoned_resume,
    check_sdc_attribution,
    check_sdc_detected,
    check_sdc_false_alarms,
)
from testbed.scenario.expect import Expect
from testbed.scenario.integrity_section import ValidatorPolicy
from testbed.scenario.parse import parse_scenario
from testbed.topology.layout import Layout
from testbed.train import checkpoint as ckpt
from testbed.train.corruption import CorruptionSpec, gradient_norm, strike
from tests.conftest import ROOT, SCENARIOS

ARRAYS = {"w": np.linspace(0.1, 1.0, 12, dtype=np.float32).reshape(3, 4), "b": np.ones(4, np.float32)}


def spec(**kw: Any) -> CorruptionSpec:
    return CorruptionSpec(**{"fault": "f0", "where": "gradient", "first_step": 3, "seed": 7, **kw})


# --- the corruption --------------------------------------------------------------------------------
def test_a_sign_flip_negates_one_value_and_records_the_truth() -> None:
    out, hits = strike(spec(bits="sign"), ARRAYS, rank=1, step=3)
    (hit,) = hits
    flat = out[hit["tensor"]].reshape(-1)
    assert flat[hit["index"]] == -ARRAYS[hit["tensor"]].reshape(-1)[hit["index"]]
    assert hit["bits"] == [31] and hit["after"] == -hit["before"]
    changed = sum(int((out[k] != ARRAYS[k]).sum()) for k in ARRAYS)
    assert changed == 1
    assert ARRAYS["w"][0, 0] == np.float32(0.1)  # the caller's arrays are left alone


def test_the_top_exponent_bit_makes_a_small_value_huge_and_the_norm_shows_it() -> None:
    out, (hit,) = strike(spec(bit=30), ARRAYS, rank=0, step=3)
    assert abs(hit["after"]) > 1e30 > abs(hit["before"])
    assert gradient_norm(out) > 1e30 > gradient_norm(ARRAYS)


def test_a_mantissa_flip_changes_a_value_by_less_than_a_part_in_two_hundred() -> None:
    for seed in range(20):
        _, (hit,) = strike(spec(bits="mantissa", seed=seed), ARRAYS, rank=0, step=3)
        assert hit["after"] != hit["before"]
        assert abs(hit["after"] - hit["before"]) <= abs(hit["before"]) * 2**-1 + 1e-12
        assert all(0 <= b < 23 for b in hit["bits"])


def test_a_bias_scales_every_value() -> None:
    out, (hit,) = strike(spec(bias=1e-3), ARRAYS, rank=0, step=3)
    np.testing.assert_allclose(out["w"], ARRAYS["w"] * 1.001, rtol=1e-6)
    assert hit["bias"] == 1e-3 and hit["tensors"] == 2


def test_the_same_seed_corrupts_the_same_bits_and_another_seed_others() -> None:
    a = strike(spec(bits="random", k=3, elements=2), ARRAYS, rank=2, step=5)[1]
    assert a == strike(spec(bits="random", k=3, elements=2), ARRAYS, rank=2, step=5)[1]
    others = [
        strike(spec(bits="random", k=3, elements=2, seed=s), ARRAYS, rank=2, step=5)[1] for s in range(8, 14)
    ]
    assert any(o != a for o in others)


def test_persistence_transient_once_persistent_every_run_intermittent_drawn_per_run() -> None:
    transient, persistent = spec(), spec(persistence="persistent")
    assert not transient.strikes(0, 2) and transient.strikes(0, 3) and transient.strikes(0, 3, 9)
    assert not transient.strikes(0, 3, 1, struck=True)  # it struck this process once: never again
    assert all(persistent.strikes(0, s, 1, struck=True) for s in range(3, 30))
    flaky = spec(persistence="intermittent", probability=0.3)
    runs = [flaky.strikes(0, 5, attempt) for attempt in range(400)]
    assert 0.2 < sum(runs) / len(runs) < 0.4
    assert runs == [flaky.strikes(0, 5, attempt) for attempt in range(400)]  # the same draws again


def test_an_escalating_corruption_doubles_what_it_strikes() -> None:
    lemon = spec(persistence="persistent", escalate_every=2, elements=1)
    assert [lemon.escalation(s) for s in (2, 3, 4, 5, 7, 9)] == [1, 1, 1, 2, 4, 8]
    assert [len(strike(lemon, ARRAYS, 0, s)[1]) for s in (3, 5, 7)] == [1, 2, 4]
    flaky = spec(persistence="intermittent", probability=0.25, escalate_every=4)
    early = sum(flaky.strikes(0, 4, a) for a in range(400)) / 400
    late = sum(flaky.strikes(0, 11, a) for a in range(400)) / 400  # 0.25 x 4: always
    assert 0.15 < early < 0.35 and late == 1.0


def test_an_index_takes_any_of_its_64_bits_and_keeps_its_integer_truth() -> None:
    idx = {"samples": np.arange(8, dtype=np.int64)}
    out, (hit,) = strike(spec(where="index", bit=40), idx, rank=0, step=3)
    assert hit["after"] - hit["before"] == 2**40 and isinstance(hit["after"], int)
    assert out["samples"].dtype == np.int64 and int((out["samples"] != idx["samples"]).sum()) == 1
    (neg,) = strike(spec(where="index", bits="sign"), idx, rank=0, step=3)[1]
    assert neg["bits"] == [63] and neg["after"] < 0
    drawn = [
        strike(spec(where="index", bits="random", seed=s), idx, 0, 3)[1][0]["bits"][0] for s in range(40)
    ]
    assert max(drawn) > 31 and all(0 <= b < 64 for b in drawn)  # not a float's fields
    assert strike(spec(bit=40), idx, rank=0, step=3)[1] == []  # a float corruption leaves integers alone


def _mlp_outputs(made: Any) -> tuple[float, dict[str, np.ndarray], list[tuple[str, str]]]:
    from testbed.topology.layout import Layout as _Layout
    from workloads.mlp import MLPRegression

    seen: list[tuple[str, str]] = []

    def watch(kind: str, name: str, value: np.ndarray) -> np.ndarray:
        seen.append((kind, name))
        return made(kind, name, value)

    w = MLPRegression({"hidden": 16, "layers": 2, "batch": 8}, seed=4, rank=0, layout=_Layout(dp=1))
    loss, grads, _ = w.local_step(watch)
    return loss, grads, seen


def test_the_mlp_shows_each_value_it_makes_and_goes_on_with_the_changed_one() -> None:
    loss, grads, seen = _mlp_outputs(lambda k, n, v: v)
    assert seen == [
        ("index", "samples"),
        ("forward", "layer 0"),
        ("forward", "layer 1"),
        ("backward", "layer 1"),
        ("backward", "layer 0"),
    ]

    def doubled(kind: str, name: str, value: np.ndarray) -> np.ndarray:
        return value * 2 if (kind, name) == ("backward", "layer 0") else value

    same_loss, changed, _ = _mlp_outputs(doubled)  # a backward corruption: same loss, other gradients
    assert same_loss == loss and not np.array_equal(changed["w0"], grads["w0"])
    assert np.array_equal(changed["w2"], grads["w2"]) and np.array_equal(changed["w1"], grads["w1"])
    fwd_loss, _, _ = _mlp_outputs(lambda k, n, v: v * 2 if (k, n) == ("forward", "layer 0") else v)
    assert fwd_loss != loss

    def far(kind: str, name: str, value: np.ndarray) -> np.ndarray:
        return value + (1 << 40) if kind == "index" else value

    with pytest.raises(IndexError):  # an index out of range fails the later gather, not the sampler
        _mlp_outputs(far)


# --- the detectors ----------------------------------------------------------------------------------
POLICY = ValidatorPolicy(spike_factor=10.0, window=5)


def test_a_gradient_norm_spike_is_attributed_to_its_rank() -> None:
    history = {0: [1.0, 1.1, 0.9], 1: [1.0, 1.0, 1.2]}
    alarm = validate(0.5, {0: 1.05, 1: 12.5}, [0.6, 0.55, 0.52], history, POLICY)
    assert alarm is not None and alarm.ranks == (1,) and "12.5x the median 1 of the last 3" in alarm.reason
    assert "rank 1's gradient norm" in alarm.reason and "x the median" in alarm.reason
    assert validate(0.5, {0: 1.05, 1: 9.5}, [0.6, 0.55, 0.52], history, POLICY) is None


def test_a_non_finite_value_trips_at_once_and_a_loss_alone_blames_no_one() -> None:
    alarm = validate(float("nan"), {0: 1.0}, [], {0: []}, POLICY)
    assert alarm is not None and alarm.ranks == () and "loss is nan" in alarm.reason
    alarm = validate(0.5, {0: float("inf")}, [], {0: []}, POLICY)
    assert alarm is not None and alarm.ranks == (0,)
    assert validate(0.5, {0: 50.0}, [], {0: [1.0]}, POLICY) is None  # too little history to judge


def test_with_three_replicas_a_spike_needs_no_history() -> None:
    norms = {0: 1.0, 1: 1.2, 2: 0.9, 3: 2e6}
    alarm = validate(0.5, norms, [], {}, POLICY, Layout(dp=4))
    assert alarm is not None and alarm.ranks == (3,) and "of its 3 replicas' at this step" in alarm.reason
    assert validate(0.5, norms, [], {}, POLICY) is None  # without the layout: no peers, no history
    assert validate(0.5, {0: 1.0, 1: 2e6}, [], {}, POLICY, Layout(dp=2)) is None  # two: who is odd?


def test_the_hash_vote_outvotes_one_of_three_and_cannot_split_two() -> None:
    layout = Layout(dp=3, tp=2)
    assert replica_groups(list(range(6)), layout) == [[0, 2, 4], [1, 3, 5]]
    digests = dict.fromkeys(range(6), "a")
    assert vote(digests, layout) is None
    digests[2] = "b"
    alarm = vote(digests, layout)
    assert alarm is not None and alarm.ranks == (2,) and alarm.detector == "parameter_hash"
    two = vote({0: "a", 1: "b"}, Layout(dp=2))
    assert two is not None and two.ranks == () and "cannot be told" in two.reason


# --- the checks, on journals made by hand -----------------------------------------------------------
def step(n: int, phase: str = "main", digest: str = "d", sdc: dict[str, Any] | None = None) -> dict[str, Any]:
    e: dict[str, Any] = {
        "event": "step_end",
        "phase": phase,
        "step": n,
        "t_start": n - 1.0,
        "t": float(n),
        "digest": f"{digest}{n}",
    }
    return {**e, "sdc": sdc} if sdc else e


def hit(rank: int = 2) -> dict[str, Any]:
    return {
        str(rank): [
            {
                "fault": "f0-sdc_params",
                "where": "params",
                "tensor": "w",
                "index": 3,
                "bits": [4],
                "before": 1.0,
                "after": 1.0001,
            }
        ]
    }


def detected(n: int, ranks: list[int], detector: str = "parameter_hash") -> dict[str, Any]:
    return {
        "event": "sdc_detected",
        "phase": "main",
        "step": n,
        "detector": detector,
        "ranks": ranks,
        "t": float(n),
    }


def committed(n: int) -> dict[str, Any]:
    return {"event": "checkpoint_committed", "phase": "main", "step": n, "t": float(n)}


def resume(n: int, verified: bool = True) -> dict[str, Any]:
    return {
        "event": "resume",
        "phase": "main",
        "from_step": n,
        "checkpoint": True,
        "source": "checkpoint",
        "verified": verified,
    }


def test_sdc_detected_passes_a_caught_corruption_and_fails_a_missed_or_late_one() -> None:
    caught = [step(1), step(2, sdc=hit()), step(3), detected(4, [2]), step(4)]
    r = check_sdc_detected(caught, Expect(max_detection_steps=2))
    assert r.status == "pass" and r.evidence["corruptions"][0]["latency"] == 2
    late = check_sdc_detected(caught, Expect(max_detection_steps=1))
    assert late.status == "fail" and "past 1" in late.summary
    missed = check_sdc_detected([step(1), step(2, sdc=hit()), step(3)], Expect())
    assert missed.status == "fail" and "missed: f0-sdc_params" in missed.summary
    early = [
        step(1),
        detected(1, [2]),
        step(2, sdc=hit()),
        step(3),
    ]  # an alarm before the onset is no detection
    assert check_sdc_detected(early, Expect()).status == "fail"


def crash(n: int, rank: int = 1) -> dict[str, Any]:
    """A failure a corrupted index caused, as the journal records it."""
    truth = {"fault": "f0-sdc_index", "where": "index", "tensor": "samples", "index": 2, "bits": [40]}
    error = {"error": "DeviceFault", "how": "direct", "sdc": [{**truth, "before": 5, "after": 5 + 2**40}]}
    return {
        "event": "failure_detected",
        "phase": "main",
        "step": n,
        "dead": [],
        "t_death": float(n),
        "t": float(n),
        "detected_by": "device_fault",
        "errors": {str(rank): error},
    }


def test_a_crash_a_corrupted_index_caused_is_its_detection_and_its_row_in_the_table() -> None:
    from testbed.report.fault_rows import fault_rows

    fired = {"event": "fault_injected", "phase": "main", "id": "f0-sdc_index", "kind": "sdc_index", "rank": 1}
    done = {
        "event": "recovery_complete",
        "phase": "main",
        "strategy": "restart",
        "resume_step": 5,
        "breakdown": {"restart_s": 30.0},
        "total_s": 30.0,
    }
    events = [step(5), {**fired, "step": 6}, crash(6), done, step(5), step(6)]
    r = check_sdc_detected(events, Expect(max_detection_steps=0))
    assert r.status == "pass", r.summary
    row = r.evidence["corruptions"][0]
    assert (row["where"], row["step"], row["detector"], row["latency"]) == ("index", 6, "device_fault", 0)
    (table,) = fault_rows(events)
    assert table["detected"].startswith("device_fault") and "recovery" in table
    healthy = [
        {**e, "errors": {"1": {"error": "DeviceFault", "how": "direct"}}} if e is events[2] else e
        for e in events
    ]
    assert check_sdc_detected(healthy, Expect()).summary == "no silent corruption struck"
    elsewhere = [step(5), crash(6, rank=1), detected(6, [3], "validator")]  # blames another: not it
    assert check_sdc_detected(elsewhere, Expect()).evidence["corruptions"][0]["detector"] == "device_fault"


def test_a_kept_replay_undoes_its_steps_first_run_in_the_truth() -> None:
    replay = {"event": "sdc_replay", "phase": "main", "step": 6, "verdict": "transient", "ranks": [2]}
    kept = [step(5), committed(4), step(6, sdc=hit()), detected(6, [2], "validator"), replay, step(6)]
    later = [committed(6), detected(8, [1]), resume(6)]
    assert check_no_poisoned_resume([*kept, *later], Expect()).status == "pass"
    assert check_sdc_false_alarms([*kept, *later], Expect()).status == "fail"  # step 8: a clean state
    unreplayed = [step(5), committed(4), step(6, sdc=hit()), *later]
    assert check_no_poisoned_resume(unreplayed, Expect()).status == "fail"


def test_sdc_attribution_fails_when_a_healthy_rank_is_blamed_or_excluded() -> None:
    right = [step(1, sdc=hit(2)), detected(2, [2])]
    assert check_sdc_attribution(right, Expect()).status == "pass"
    wrong = [step(1, sdc=hit(2)), detected(2, [1])]
    r = check_sdc_attribution(wrong, Expect())
    assert r.status == "fail" and "blamed healthy rank 1" in r.summary
    assert r.evidence["confusion"] == {"2": {"1": 1}}
    excluded = [*right, {"event": "npu_excluded", "phase": "main", "step": 2, "ranks": [0]}]
    assert check_sdc_attribution(excluded, Expect()).status == "fail"
    undecided = check_sdc_attribution([step(1, sdc=hit(2)), detected(2, [])], Expect())
    assert undecided.status == "pass" and "could not tell" in undecided.summary


def test_a_corrupted_payload_is_its_links_fault_not_an_npus() -> None:
    payload = {
        "2": [
            {
                "fault": "f0-sdc_payload",
                "where": "payload",
                "tensor": "payload 1->2",
                "index": 0,
                "bits": [30],
                "before": 1.0,
                "after": 1e30,
            }
        ]
    }
    blamed = check_sdc_attribution([step(4, sdc=payload), detected(6, [2])], Expect())
    assert blamed.status == "fail" and "blamed healthy rank 2" in blamed.summary
    assert check_sdc_false_alarms([step(4, sdc=payload), detected(6, [2])], Expect()).status == "pass"
    found = check_sdc_detected([step(4, sdc=payload), detected(6, [1])], Expect())  # an end of its link
    assert found.status == "pass" and found.evidence["corruptions"][0]["link"] == [1, 2]
    assert check_sdc_detected([step(4, sdc=payload), detected(6, [3])], Expect()).status == "fail"


def test_sdc_false_alarms_counts_alarms_on_a_clean_state_against_its_bound() -> None:
    clean = [step(n) for n in range(1, 11)] + [detected(10, [3], "validator")]
    r = check_sdc_false_alarms(clean, Expect())
    assert r.status == "fail" and r.evidence["per_1000_steps"] == 100.0
    assert check_sdc_false_alarms(clean, Expect(max_false_alarms=100.0)).status == "pass"
    # a corruption carried by a restored checkpoint is still there: the next alarm is a true one
    carried = [
        step(5, sdc=hit()),
        committed(6),
        detected(8, [2]),
        resume(6, False),
        step(7),
        detected(8, [2]),
    ]
    assert check_sdc_false_alarms(carried, Expect()).status == "pass"


def test_no_poisoned_resume_fails_a_checkpoint_written_after_the_onset() -> None:
    poisoned = [step(5), committed(4), step(6, sdc=hit()), committed(6), detected(8, [2]), resume(6, False)]
    r = check_no_poisoned_resume(poisoned, Expect())
    assert r.status == "fail" and "step 6, written after the corruption of step 6" in r.summary
    clean = [step(4), committed(4), step(6, sdc=hit()), committed(6), detected(8, [2]), resume(4)]
    assert check_no_poisoned_resume(clean, Expect()).status == "pass"
    # with a reference run, the digests decide: the same checkpoint of step 4, unequal to it, fails
    ref = [step(4, "reference", digest="other")]
    r = check_no_poisoned_resume([*clean, *ref], Expect())
    assert r.status == "fail" and "differs from the uninterrupted run's" in r.summary


def test_the_integrity_checks_run_only_in_a_run_that_has_them() -> None:
    names = {r.name for r in run_checks([step(1)], Expect())}
    assert "sdc_detected" not in names
    names = {r.name for r in run_checks([{"event": "integrity", "policy": None}, step(1)], Expect())}
    assert {"sdc_detected", "sdc_attribution", "sdc_false_alarms", "no_poisoned_resume"} <= names


def test_goodput_counts_the_detectors_time_as_integrity() -> None:
    events = [step(1), {"event": "integrity_check", "phase": "main", "step": 1, "t_start": 1.0, "t": 1.5}]
    g = goodput([*events, {"event": "phase_end", "phase": "main", "t": 1.5}])
    assert g is not None and g["integrity_s"] == pytest.approx(0.5) and g["useful_s"] == pytest.approx(1.0)


# --- retention keeps a verified checkpoint ------------------------------------------------------------
def test_retention_keeps_the_newest_verified_checkpoint(tmp_path: Path) -> None:
    for s in (2, 4, 6, 8):
        (tmp_path / f"step_{s:08d}").mkdir()
    assert [s for s, _ in ckpt.committed(tmp_path)] == [2, 4, 6, 8]
    assert ckpt.prune(tmp_path, 2, verified={4}) == [2]
    assert [s for s, _ in ckpt.committed(tmp_path)] == [4, 6, 8]


# --- bad input ------------------------------------------------------------------------------------------
SCENARIO = (SCENARIOS / "sdc_mantissa_hash.yaml").read_text()


@pytest.mark.parametrize(
    ("old", "new", "needle"),
    [
        ("    bits: mantissa", "    bit: 40", "bit 40 is past the workloads' float32: give 0..31"),
        ("    bits: mantissa", "    probability: 1.5", "probability 1.5: give a number in [0, 1]"),
        (
            "    bits: mantissa",
            "    bits: middle",
            "bits 'middle': choose from sign, exponent, mantissa, random",
        ),
        ("    hash: {every: 4}", "    hash: {every: 0}", "policy.integrity.hash.every"),
        ("  parallel: {dp: 4}", "  parallel: {dp: 1, tp: 4}", "this job has dp=1"),
        (
            "    restore: verified",
            "    restore: verified\n    strikes: {count: 0}",
            "policy.integrity.strikes.count",
        ),
        (
            "    bits: mantissa",
            "    escalate_every: 2",
            "a transient corruption strikes once and cannot escalate",
        ),
    ],
    ids=[
        "bit-past-dtype",
        "probability",
        "bits",
        "interval-0",
        "hash-dp1",
        "strikes-0",
        "escalate-transient",
    ],
)
def test_bad_integrity_input_is_refused_with_a_fix(old: str, new: str, needle: str) -> None:
    assert old in SCENARIO
    with pytest.raises(ScenarioError) as err:
        parse_scenario(SCENARIO.replace(old, new), "s.yaml")
    assert needle in str(err.value), str(err.value)


def test_restore_verified_without_a_hash_says_how_to_fix_it(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(SCENARIO.replace("    hash: {every: 4}\n", ""))
    proc = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "validate", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 254 and "Traceback" not in proc.stderr
    assert "restore: verified needs a hash" in proc.stderr and "restore: newest" in proc.stderr


# --- drills: the kinds drawn, the invariant -------------------------------------------------------------
def test_the_invariant_flags_a_poisoned_resume_that_does_not_say_so(tmp_path: Path) -> None:
    from testbed.report.invariants import INVARIANTS, poisoned_resume_said

    silent = [step(5), committed(4), step(6, sdc=hit()), committed(6), resume(6, verified=True)]
    (problem,) = poisoned_resume_said(silent, tmp_path)
    assert "step 6, written after the silent corruption of step 6, as if it were sound" in problem
    restart = [*silent[:-1], {"event": "resume", "phase": "main", "from_step": 6, "source": "checkpoint"}]
    assert "verified: not said" in poisoned_resume_said(restart, tmp_path)[0]
    assert poisoned_resume_said([*silent[:-1], resume(6, verified=False)], tmp_path) == []
    assert poisoned_resume_said([*silent[:-1], resume(4)], tmp_path) == []
    assert INVARIANTS["poisoned_resume_said"] is poisoned_resume_said  # every drill keeps it


def test_drills_draw_corruption_only_for_a_base_that_runs_detectors() -> None:
    from testbed.scenario.parse import load_scenario
    from testbed.testing.schedules import usable_kinds

    plain, guarded = load_scenario(SCENARIOS / "drill.yaml"), load_scenario(SCENARIOS / "drill_sdc.yaml")
    assert not {"sdc_gradient", "sdc_params", "sdc_activation"} & set(usable_kinds(plain))
    assert {"sdc_gradient", "sdc_params", "sdc_activation"} <= set(usable_kinds(guarded))
    assert "sdc_index" not in usable_kinds(guarded)  # a stage that gathers nothing: no effect to confirm


def test_every_drawn_corruption_is_a_valid_fault_of_the_base() -> None:
    from hypothesis import HealthCheck, given, settings

    from testbed.scenario.parse import load_scenario
    from testbed.testing.schedules import fault_schedules, with_faults

    base = load_scenario(SCENARIOS / "drill_sdc.yaml")

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(fault_schedules(base, max_faults=2, kinds=("sdc_gradient", "sdc_params", "sdc_activation")))
    def drawn(schedule: list[dict[str, Any]]) -> None:
        scenario = with_faults(base, schedule)
        assert [f.kind for f in scenario.faults] == [f["kind"] for f in schedule]
        assert all(f.kind.startswith("sdc_") and 1 <= f.at["step"] < 12 for f in scenario.faults)

    drawn()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--shapes", "gradient-nope"], "shapes from gradient-exponent"),
        (["--every", "two"], "--every 'two': give whole numbers of steps"),
        (["--every", "0"], "intervals of 1 or more"),
    ],
    ids=["shape", "every-text", "every-0"],
)
def test_sdc_sweep_refuses_bad_arguments_before_any_run(tmp_path: Path, args: list[str], needle: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "testbed.cli",
            "sdc-sweep",
            str(SCENARIOS / "sdc_mantissa_hash.yaml"),
            *args,
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 254 and "Traceback" not in proc.stderr
    assert needle in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("name", "old", "new", "needle"),
    [
        (
            "sdc_payload_checksum",
            "target: {link: [1, 2]}",
            "target: {rank: 2}",
            "sdc_payload takes 'target: {link: [a, b]}'",
        ),
        ("sdc_payload_checksum", "target: {link: [1, 2]}", "target: {link: [1, 9]}", "two ranks of 0..3"),
        (
            "sdc_payload_checksum",
            "half: reduce_scatter",
            "half: middle",
            "half 'middle': choose from reduce_scatter, allgather, any",
        ),
        (
            "sdc_index_crash",
            "bit: 40",
            "bits: exponent",
            "an index has no exponent or mantissa; choose sign or",
        ),
        ("sdc_index_crash", "bit: 40", "bias: 0.001", "an index cannot be biased: drop bias and flip bits"),
        ("sdc_index_crash", "bit: 40", "bit: 64", "bit 64 is past the workloads' int64 indices: give 0..63"),
        (
            "sdc_activation_forward",
            "during: forward",
            "during: sideways",
            "during 'sideways': choose forward",
        ),
        ("sdc_activation_forward", "bit: 30", "bit: 32", "past the workloads' float32: give 0..31"),
        (
            "sdc_optimizer_state",
            "state: optimizer",
            "state: disk",
            "state 'disk': choose params or optimizer",
        ),
    ],
    ids=[
        "payload-not-a-link",
        "payload-rank-outside",
        "payload-half",
        "index-exponent",
        "index-bias",
        "index-bit",
        "activation-during",
        "activation-bit",
        "params-state",
    ],
)
def test_a_bad_corruption_fault_is_refused_with_a_fix(name: str, old: str, new: str, needle: str) -> None:
    text = (SCENARIOS / f"{name}.yaml").read_text()
    assert old in text
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text.replace(old, new, 1), "s.yaml")
    assert needle in str(err.value), str(err.value)


# --- skipping the batches of the abandoned steps (PaLM's remedy) ----------------------------------------
def test_a_rollback_skips_the_batches_of_the_abandoned_steps_and_folds_in_their_own_skips() -> None:
    from testbed.integrity.data_skips import DataSkips

    skips = DataSkips()
    assert skips.skip_after(restored=8, detected=10) == 2 and skips.due(9) == 2 and skips.due(10) == 0
    # a later rollback past that skip: the batches of steps 5..12 and the 2 skipped before step 9
    assert skips.skip_after(restored=4, detected=12) == 10
    assert skips.before == {5: 10} and skips.total() == 10
    assert skips.skip_after(restored=6, detected=7) == 1 and skips.before == {5: 10, 7: 1}


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_skipping_batches_moves_the_data_and_nothing_else(name: str) -> None:
    from unittest.mock import MagicMock

    from testbed.topology.layout import Layout as _Layout
    from workloads.base import WORKLOADS

    def make() -> Any:
        info = WORKLOADS[name]
        return info.factory({**info.options, "steps": 10}, 3, 0, _Layout(dp=1))

    def batches(w: Any, n: int) -> list[list[int]]:
        seen: list[list[int]] = []

        def watch(kind: str, what: str, value: np.ndarray) -> np.ndarray:
            seen.append(value.tolist())
            return value

        ctx = MagicMock()
        ctx.output.side_effect = watch
        for _ in range(n):
            watch("index", "samples", w._next_batch()) if name == "mlp" else w._micro_batches(ctx)
        return seen

    straight, skipping, fresh = make(), make(), make()
    drawn = batches(straight, 4)
    skipping.skip_batches(2)
    for component in ("params", "rng"):  # no random draw, no parameter moved
        kept, before = skipping.state(component), fresh.state(component)
        assert all(np.array_equal(kept[k], before[k]) for k in before), component
    assert batches(skipping, 2) == drawn[2:4]


def test_skip_batches_needs_a_rollback() -> None:
    text = (SCENARIOS / "sdc_skip_batches.yaml").read_text()
    with pytest.raises(ScenarioError) as err:
        parse_scenario(
            text.replace("skip_batches: true", "skip_batches: true\n    on_detect: report"), "s.yaml"
        )
    assert "skip_batches skips data when a detection rolls back, and on_detect is report" in str(err.value)


def test_matches_uninterrupted_names_the_batches_both_runs_skipped_and_fails_when_they_differ() -> None:
    from testbed.report.resume_checks import check_matches_uninterrupted

    def end(phase: str, digest: str) -> dict[str, Any]:
        return {"event": "phase_end", "phase": phase, "digest": digest, "t": 9.0}

    skipped = [
        resume(4),
        {"event": "batches_skipped", "phase": "main", "step": 5, "batches": 2},
        end("main", "a"),
        {"event": "batches_skipped", "phase": "reference", "step": 5, "batches": 2},
    ]
    same = check_matches_uninterrupted([*skipped, end("reference", "a")], Expect())
    assert same.status == "pass" and "which skipped the same batches: 2 before step 5" in same.summary
    differs = check_matches_uninterrupted([*skipped, end("reference", "b")], Expect())
    assert differs.status == "fail"
