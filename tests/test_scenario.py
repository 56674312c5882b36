"""Scenario validation: every problem at once, each with its line and a fix; never a traceback."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from testbed.core.errors import ScenarioError
from testbed.scenario.parse import load_scenario, parse_scenario
from tests.conftest import SCENARIOS

BASE = """\
version: 1
name: t
seed: 3
cluster: {preset: atlas-900-a3, supernodes: 2, npus_per_supernode: 2}
workload: {name: mlp, steps: 20, parallel: {dp: 4}}
faults:
  - kind: node_kill
    target: {rank: 1}
    at: {step: 5, during: allreduce}
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "s.yaml")
    return info.value.problems  # type: ignore[attr-defined,no-any-return]


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.name)
def test_library_scenarios_are_valid(path: object) -> None:
    load_scenario(str(path))


def test_base_parses_into_the_typed_model() -> None:
    s = parse_scenario(BASE, "s.yaml")
    assert s.cluster.topology().world == 4
    assert s.faults[0].target == {"rank": 1}
    assert s.policy.timeouts.connect_s == 120 and s.policy.timeouts.exec_s == 1836
    assert s.with_seed(9).seed == 9 and s.with_seed(9).digest() != s.digest()


def test_malformed_yaml_names_its_line() -> None:
    (msg,) = problems(BASE + "expect: {recovered: true\n  bad: [\n")
    assert "not valid YAML" in msg
    assert int(msg.split(":")[1]) == 11


def test_unknown_fault_kind_lists_the_known_ones() -> None:
    (msg,) = problems(BASE.replace("node_kill", "node_kil"))
    assert "s.yaml:7" in msg and "faults[0].kind" in msg
    known = (
        "checkpoint_pause, controller_kill, data_stall, hang, io_saturation, link_degrade, link_drop, "
        "link_flap, link_netem, link_setup_delay, memory_fragment, node_kill, partition, preempt, "
        "sdc_activation, sdc_gradient, sdc_index, sdc_params, sdc_payload, "
        "storage_corrupt, storage_full, storage_torn_write, straggler, unsupported_op, version_mismatch"
    )
    assert f"Known kinds: {known}" in msg
    assert "Did you mean 'node_kill'" in msg


def test_target_rank_outside_the_cluster() -> None:
    (msg,) = problems(BASE.replace("rank: 1", "rank: 4"))
    assert "s.yaml:8" in msg and "rank 4 is outside the cluster" in msg and "0..3" in msg


def test_parallel_layout_that_does_not_fit() -> None:
    (msg,) = problems(BASE.replace("dp: 4", "dp: 8"))
    assert "s.yaml:5" in msg and "does not fit" in msg and "4 NPUs" in msg


def test_every_problem_is_reported_at_once() -> None:
    text = (
        BASE.replace("dp: 4", "dp: 3").replace("rank: 1", "rank: 9").replace("preset: atlas", "prest: atlas")
    )
    found = problems(text)
    assert len(found) == 3
    assert any("did you mean 'preset'" in p for p in found)


def test_duplicate_keys_and_wrong_version() -> None:
    found = problems(BASE.replace("version: 1", "version: 2\nseed: 4"))
    assert any("version must be 1" in p for p in found)
    assert any("appears twice" in p for p in found)


def test_unsafe_yaml_tags_are_refused() -> None:
    for evil in ("x: !!python/object/apply:os.system ['true']\n", "x: !!python/name:os.system ''\n"):
        (msg,) = problems(BASE + evil)
        assert "not valid YAML" in msg and "s.yaml:10" in msg


KEYS = st.sampled_from(
    [
        "version",
        "name",
        "seed",
        "cluster",
        "workload",
        "policy",
        "faults",
        "expect",
        "preset",
        "steps",
        "rank",
        "kind",
        "every",
        "include",
        "dp",
        "at",
        "target",
    ]
)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10) | st.floats(allow_nan=True) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=12,
)


@given(doc=st.dictionaries(KEYS, VALUES, max_size=8))
def test_any_document_gives_a_scenario_or_a_scenario_error(doc: dict[str, object]) -> None:
    text = yaml.safe_dump(doc)
    try:
        parse_scenario(text, "fuzz.yaml")
    except ScenarioError as exc:
        assert exc.problems  # type: ignore[attr-defined]
        assert all(p.startswith("fuzz.yaml") for p in exc.problems)  # type: ignore[attr-defined]


LINK = BASE.replace(
    """  - kind: node_kill
    target: {rank: 1}
    at: {step: 5, during: allreduce}
""",
    """  - kind: link_degrade
    target: {link: [0, 1]}
    at: {step: 0}
    bandwidth_factor: 0.5
    add_latency: 2ms
    duration: 30s
""",
)


def test_link_faults_parse_with_units_and_plan_their_links() -> None:
    from testbed.scenario.plan import make_plan

    s = parse_scenario(LINK, "s.yaml")
    (fault,) = make_plan(s)
    assert fault.params["links"] == [[0, 1], [1, 0]]
    assert fault.params["add_latency"] == pytest.approx(0.002) and fault.params["duration"] == 30.0


def test_link_fault_problems_are_named() -> None:
    found = problems(
        LINK.replace("link: [0, 1]", "link: [0, 9]")
        .replace("duration: 30s", "duration: soon")
        .replace("bandwidth_factor: 0.5", "bandwidth_factor: 3")
    )
    assert any("two different ranks" in p for p in found)
    assert any("'soon' is not a duration" in p for p in found)
    assert any("bandwidth_factor must be in (0, 1]" in p for p in found)


def test_a_random_link_target_is_one_the_job_uses_and_follows_the_seed() -> None:
    from testbed.scenario.plan import facts_of, make_plan

    text = LINK.replace("target: {link: [0, 1]}", "target: {mode: random}")
    s = parse_scenario(text, "s.yaml")
    links = {tuple(x) for x in make_plan(s)[0].params["links"]}
    assert links <= set(facts_of(s).job_links) | {(b, a) for a, b in facts_of(s).job_links}
    assert make_plan(s) == make_plan(parse_scenario(text, "s.yaml"))


PARALLEL = """\
version: 1
name: p
cluster: {preset: atlas-900-a3, supernodes: 2, npus_per_supernode: 4}
workload: {name: transformer, steps: 4, parallel: {dp: 2, tp: 2, pp: 2}, moe_every: 2}
"""


def test_a_parallel_layout_parses_with_its_four_degrees() -> None:
    s = parse_scenario(PARALLEL, "p.yaml")
    assert (s.workload.dp, s.workload.tp, s.workload.pp, s.workload.ep) == (2, 2, 2, 1)
    assert s.warnings == ()
    implied = parse_scenario(PARALLEL.replace("dp: 2, ", ""), "p.yaml")
    assert implied.workload.dp == 2  # dp fills the cluster when not given


def test_the_mlp_refuses_model_parallelism_and_names_the_workload_that_has_it() -> None:
    (msg,) = problems(BASE.replace("dp: 4", "dp: 2, tp: 2"))
    assert "s.yaml:5" in msg and "data-parallel only" in msg and "transformer" in msg


@pytest.mark.parametrize(
    ("workload", "expected"),
    [
        ("parallel: {dp: 2, tp: 2, pp: 2}, batch: 10", "batch 10 must split evenly over dp x ep = 2"),
        ("parallel: {dp: 2, tp: 2, pp: 2}, batch: 0", "batch 0 must split evenly over dp x ep = 2"),
        ("parallel: {dp: 2, tp: 2, pp: 2}, micro_batches: 0", "micro_batches 0 must be at least 1"),
        (
            "parallel: {dp: 2, tp: 2, pp: 2}, micro_batches: 1.5",
            "workload.micro_batches: expected a whole number (default 2), got 1.5",
        ),
        (
            "parallel: {dp: 2, tp: 2, pp: 2}, layers: 3.5",
            "workload.layers: expected a whole number (default 4), got 3.5",
        ),
        ("parallel: {dp: 1, tp: 2, pp: 2, ep: 2}", "ep = 2 needs MoE blocks; set moe_every"),
        (
            "parallel: {tp: 2, pp: 2, ep: 2}, moe_every: 2, experts: 3",
            "experts 3 must be a multiple of ep = 2",
        ),
        ("parallel: {dp: 2, tp: 2, pp: 2}, ffn: 255", "ffn 255 must be a multiple of tp = 2"),
        ("parallel: {dp: 2, tp: 2, pp: 2}, layers: 1", "layers 1 must be at least pp = 2"),
        ("parallel: {dp: 2, tp: 2, pp: 2}, zero: 2", "zero 2 must be 0 (gradient allreduce) or 1"),
        ("parallel: {dp: 2, tp: 2, pp: 2}, router_skew: 2", "router_skew 2 needs MoE blocks to route"),
        (
            "parallel: {dp: 2, tp: 2, pp: 2}, moe_every: 2, router_skew: -1",
            "workload.router_skew: expected a non-negative number (default 0.0), got -1",
        ),
    ],
)
def test_transformer_options_that_do_not_fit_the_layout(workload: str, expected: str) -> None:
    text = PARALLEL.replace("parallel: {dp: 2, tp: 2, pp: 2}, moe_every: 2", workload)
    (msg,) = problems(text)
    assert "s.yaml:4: workload" in msg and expected in msg


def test_a_count_given_as_a_fraction_is_refused_where_it_was_cut_off_unsaid() -> None:
    (msg,) = problems(BASE.replace("dp: 4}", "dp: 4}, batch: 31.5, lr: 0.01"))
    assert "workload.batch: expected a whole number (default 32), got 31.5" in msg
    assert (
        parse_scenario(BASE.replace("dp: 4}", "dp: 4}, batch: 64.0, lr: 1"), "s.yaml").workload.options[
            "batch"
        ]
        == 64
    )  # a float that is whole is a whole number, and lr is no count


def test_tp_across_supernodes_is_allowed_with_a_warning_naming_the_group() -> None:
    s = parse_scenario(PARALLEL.replace("dp: 2, tp: 2, pp: 2", "tp: 8"), "p.yaml")
    (warning,) = s.warnings
    assert "TP group [0, 1, 2, 3, 4, 5, 6, 7] spans supernodes [0, 1]" in warning
    assert "tp <= 4" in warning


def test_unsupported_op_fault_validates_its_operator() -> None:
    fault = "faults:\n  - {kind: unsupported_op, target: {rank: 6}, at: {step: 2}, op: flash_attention}\n"
    (msg,) = problems(PARALLEL + fault)
    assert "s.yaml:6" in msg and "'flash_attention' is not an operator" in msg and "softmax" in msg
    ok = parse_scenario(PARALLEL + fault.replace("flash_attention", "gelu"), "p.yaml")
    assert ok.faults[0].params == {"op": "gelu"}


STORAGE = """\
version: 1
name: s
cluster: {preset: atlas-800t-a2, supernodes: 1, npus_per_supernode: 4}
workload: {name: mlp, steps: 30, parallel: {dp: 4}}
policy: {checkpoint: {every: EVERY}}
faults:
  - {kind: KIND, target: {rank: 1}, at: {step: STEP}}
"""


@pytest.mark.parametrize(
    ("kind", "every", "step", "expected"),
    [
        ("storage_torn_write", 10, 11, None),
        ("storage_torn_write", 0, 11, "none is written; set policy.checkpoint.every"),
        ("storage_torn_write", 20, 25, "the first checkpoint at or after step 25 is step 40, past step 30"),
        ("storage_corrupt", 10, 25, "the first checkpoint at or after step 25 is step 30, past step 29"),
    ],
)
def test_storage_faults_name_the_checkpoint_they_hit(
    kind: str, every: int, step: int, expected: str | None
) -> None:
    text = STORAGE.replace("KIND", kind).replace("EVERY", str(every)).replace("STEP", str(step))
    if expected is None:
        s = parse_scenario(text, "s.yaml")
        from testbed.scenario.plan import make_plan

        (planned,) = make_plan(s)
        assert planned.step == 20 and planned.point == "shard.mid"
        return
    (msg,) = problems(text)
    assert expected in msg and "s.yaml:7" in msg


@pytest.mark.parametrize(
    ("target", "ranks"), [("{rank: 2}", [2]), ("{supernode: 1}", [2, 3]), ("{mode: random}", None)]
)
def test_node_kill_targets_a_rank_a_supernode_or_a_seeded_random_rank(
    target: str, ranks: list[int] | None
) -> None:
    from testbed.scenario.plan import make_plan

    text = BASE.replace("{rank: 1}", target)
    (planned,) = make_plan(parse_scenario(text, "s.yaml"))
    if ranks is not None:
        assert planned.params["ranks"] == ranks
        return
    drawn = {
        tuple(make_plan(parse_scenario(text.replace("seed: 3", f"seed: {s}"), "s.yaml"))[0].params["ranks"])
        for s in range(12)
    }
    assert all(len(r) == 1 and 0 <= r[0] < 4 for r in drawn) and len(drawn) > 1  # follows the seed
    assert make_plan(parse_scenario(text, "s.yaml"))[0].params == planned.params  # and only the seed


def test_node_kill_refuses_a_supernode_outside_the_cluster() -> None:
    (msg,) = problems(BASE.replace("{rank: 1}", "{supernode: 2}"))
    assert "supernode must be in 0..1" in msg


def test_an_unsigned_yaml_exponent_gets_a_hint() -> None:
    (msg,) = problems(BASE.replace("steps: 20,", "steps: 20, compute_scale: 2.0e7,"))
    assert "expected a number, got '2.0e7'" in msg and "write 2.0e+7" in msg
    assert (
        parse_scenario(
            BASE.replace("steps: 20,", "steps: 20, compute_scale: 2.0e+7,"), "s.yaml"
        ).workload.compute_scale
        == 2e7
    )


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        (
            "{kind: io_saturation, target: {storage: shared}, at: {step: 2}, factor: 0}",
            "factor is the bandwidth left",
        ),
        ("{kind: storage_full, target: {link: [0, 1]}, at: {step: 2}}", "acts on the shared storage"),
        (
            "{kind: storage_full, target: {rank: 1}, at: {step: 2}, point: rename}",
            "a rank's quota strikes its own shard",
        ),
        ("{kind: data_stall, target: {rank: 1}, at: {step: 2}, delay: soon}", "'soon' is not a duration"),
        ("{kind: data_stall, target: {rank: 9}, at: {step: 2}}", "ranks are 0..3"),
        (
            "{kind: io_saturation, at: {step: 2}, for_steps: 0}",
            "for_steps must be a whole number of at least 1",
        ),
    ],
)
def test_storage_and_data_faults_name_what_is_wrong(fault: str, expected: str) -> None:
    (msg,) = problems(BASE.split("faults:")[0] + f"faults:\n  - {fault}\n")
    assert expected in msg


def test_the_timeout_ladder_warns_on_each_rung_out_of_order_naming_both_values() -> None:
    from testbed.scenario.model import DetectionPolicy, TimeoutPolicy
    from testbed.scenario.timeout_ladder import ladder_warnings, rdma_retransmit_s

    assert rdma_retransmit_s(20) == pytest.approx(4.295, rel=1e-3)
    assert ladder_warnings(TimeoutPolicy(), DetectionPolicy()) == []
    assert ladder_warnings(TimeoutPolicy(pg_timeout_s=3600), DetectionPolicy()) == []
    (rdma,) = ladder_warnings(TimeoutPolicy(rdma_timeout=24, rdma_retry_cnt=7), None)
    assert "RDMA retry window 481 s" in rdma and "link-setup limit 140 s" in rdma
    (link,) = ladder_warnings(TimeoutPolicy(exec_s=30), None)
    assert "link-setup limit 140 s" in link and "exec timeout 30 s" in link
    (pg,) = ladder_warnings(TimeoutPolicy(pg_timeout_s=1800), None)
    assert "exec timeout 1836 s" in pg and "process-group timeout 1800 s" in pg
    (beat,) = ladder_warnings(TimeoutPolicy(), DetectionPolicy(heartbeat_s=5, missed=1))
    assert "heartbeat interval 5 s" in beat and "heartbeat timeout 5 s" in beat


def test_a_scenario_out_of_ladder_order_validates_with_its_warning() -> None:
    good = (SCENARIOS / "quickstart.yaml").read_text()
    text = good.replace(
        "timeouts: {connect_s: 120, exec_s: 1836}", "timeouts: {exec_s: 30, pg_timeout_s: 20}"
    )
    s = parse_scenario(text, "t.yaml")
    assert len([w for w in s.warnings if w.startswith("timeout ladder")]) == 2
    bad = good.replace("timeouts: {connect_s: 120, exec_s: 1836}", "timeouts: {rdma_timeout: 30}")
    with pytest.raises(ScenarioError) as err:
        parse_scenario(bad, "t.yaml")
    assert "policy.timeouts.rdma_timeout" in str(err.value)


def test_adding_a_fault_never_moves_what_another_fault_draws() -> None:
    from testbed.scenario.plan import make_plan

    one = "faults:\n  - {kind: node_kill, target: {mode: random}, at: {step: 27}}\n"
    two = (
        "faults:\n  - {kind: straggler, target: {rank: 1}, at: {step: 3}}\n"
        "  - {kind: node_kill, target: {mode: random}, at: {step: 27}}\n"
        "  - {kind: node_kill, target: {mode: random}, at: {step: 27}}\n"
    )
    base = (SCENARIOS / "quickstart.yaml").read_text().split("faults:")[0]
    tail = "expect: {recovered: true}\n"
    alone = [f for f in make_plan(parse_scenario(base + one + tail, "a.yaml")) if f.kind == "node_kill"]
    among = [f for f in make_plan(parse_scenario(base + two + tail, "b.yaml")) if f.kind == "node_kill"]
    assert alone[0].params["ranks"] in [f.params["ranks"] for f in among]
    draws = {
        tuple(f.params["ranks"])
        for seed in range(20)
        for f in make_plan(
            parse_scenario((base + two + tail).replace("seed: 1234", f"seed: {seed}"), "c.yaml")
        )
        if f.kind == "node_kill"
    }
    assert len(draws) > 1  # identical entries draw from separate streams


@pytest.mark.parametrize(
    ("expect", "field", "value"),
    [
        ("{failures: 2}", "failures", (2.0, 2.0)),
        ("{failures: [1, 3]}", "failures", (1.0, 3.0)),
        ("{recovery_s: 60}", "recovery_s", (0.0, 60.0)),
        ("{goodput: 0.5}", "goodput", (0.5, 1.0)),
        ("{goodput: [0.2, 0.4]}", "goodput", (0.2, 0.4)),
    ],
)
def test_a_tolerance_is_a_scalar_or_an_inclusive_range(
    expect: str, field: str, value: tuple[float, float]
) -> None:
    text = (SCENARIOS / "quickstart.yaml").read_text().split("expect:")[0] + f"expect: {expect}\n"
    got = getattr(parse_scenario(text, "t.yaml").expect, field)
    assert (got.lo, got.hi) == value


@pytest.mark.parametrize(
    ("expect", "needle"),
    [
        ("{failures: [3, 1]}", "inclusive range [low, high]"),
        ("{goodput: 1.5}", "between 0 and 1"),
        ("{recovery_s: fast}", "inclusive range"),
        ("{detected_by: heartbeet}", "Did you mean 'heartbeat'"),
        ("{detected_by: []}", "a detector or a list of them"),
    ],
)
def test_a_bad_tolerance_is_refused_with_the_fix(expect: str, needle: str) -> None:
    text = (SCENARIOS / "quickstart.yaml").read_text().split("expect:")[0] + f"expect: {expect}\n"
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text, "t.yaml")
    assert needle in str(err.value)


def test_policy_durations_take_units_and_name_a_bad_one() -> None:
    text = BASE.replace(
        "faults:",
        "policy:\n  timeouts: {exec_s: 30m, connect_s: 2m}\n  detection: {heartbeat_s: 500ms, missed: 3}\n"
        "  recovery: {restart_s: 1m, spare_s: 5s}\nexpect: {max_recovery_s: 10m}\nfaults:",
    )
    s = parse_scenario(text, "s.yaml")
    assert (s.policy.timeouts.exec_s, s.policy.timeouts.connect_s) == (1800.0, 120.0)
    assert s.policy.detection is not None and s.policy.detection.heartbeat_s == 0.5
    assert (s.policy.recovery.restart_s, s.policy.recovery.spare_s, s.expect.max_recovery_s) == (
        60.0,
        5.0,
        600.0,
    )
    (msg,) = problems(text.replace("exec_s: 30m", "exec_s: half an hour"))
    assert "policy.timeouts.exec_s" in msg and "a duration like 30, '30s', '500ms' or '2h'" in msg
    (msg,) = problems(text.replace("connect_s: 2m", "connect_s: 1m"))
    assert "60.0 is out of range; use a value between 120 and 7200" in msg


@pytest.mark.parametrize("seed", [-1, 2**63, True, 1.5])
def test_another_seed_must_be_one_a_file_could_give(seed: object) -> None:
    quick = load_scenario(SCENARIOS / "quickstart.yaml")
    with pytest.raises(ScenarioError, match="a seed is a non-negative integer of at most 2"):
        quick.with_seed(seed)  # type: ignore[arg-type]
    assert quick.with_seed(2**63 - 1).seed == 2**63 - 1


def test_reference_run_false_is_refused_beside_what_is_judged_against_the_reference() -> None:
    quick = (SCENARIOS / "quickstart.yaml").read_text()
    declared = "  checkpoint_complete: true\n  matches_uninterrupted: true\n"
    assert declared in quick
    plain = quick.replace(declared, "")
    skipping = plain.replace("expect:\n", "expect:\n  reference_run: false\n")
    assert parse_scenario(skipping).expect.reference_run is False
    # unset, the key leaves the scenario's digest as it was before it existed; set, it is content
    assert parse_scenario(plain).expect.reference_run is None
    assert parse_scenario(plain).digest() != parse_scenario(skipping).digest()
    with pytest.raises(ScenarioError) as err:
        parse_scenario(quick.replace("expect:\n", "expect:\n  reference_run: false\n"))
    assert "expect.reference_run" in str(err.value), str(err.value)
    assert "drop checkpoint_complete or reference_run" in str(err.value), str(err.value)
    sdc = (SCENARIOS / "sdc_mantissa_hash.yaml").read_text().replace("  matches_uninterrupted: true\n", "")
    with pytest.raises(ScenarioError) as err:
        parse_scenario(sdc.replace("expect:\n", "expect:\n  reference_run: false\n"))
    assert "silent corruption faults is judged against the uninterrupted reference run" in str(err.value)
    parse_scenario(sdc)  # valid without the key
