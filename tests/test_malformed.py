"""A corpus of malformed scenarios: each is refused with exit 254 and a message naming its line and the
fix; and a fuzz test: mutated library scenarios give a scenario or a ScenarioError, never a traceback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.cli import main
from testbed.errors import ScenarioError
from testbed.scenario import parse_scenario
from tests.conftest import SCENARIOS

BASE = (SCENARIOS / "quickstart.yaml").read_text()
FAULT = "  - kind: node_kill\n    target: {rank: 5}\n    at: {step: 27, during: allreduce}\n"


def sub(old: str, new: str) -> Callable[[str], str]:
    def mutate(text: str) -> str:
        assert old in text, old
        return text.replace(old, new)

    return mutate


def add_after(anchor: str, line: str) -> Callable[[str], str]:
    return sub(anchor, anchor + "\n" + line)


#: (id, mutation of the quick start, the line the message must name, what the message must say)
CORPUS: list[tuple[str, Callable[[str], str], int | None, str]] = [
    ("yaml-syntax", sub("recovery: {", "recovery: {{"), 26, "not valid YAML"),
    ("tab-indent", sub("  preset:", "\tpreset:"), 10, "Check the indentation"),
    ("object-tag", sub("seed: 1234", "seed: !!python/object/apply:os.system ['true']"), 8, "plain data only"),
    ("custom-tag", sub("seed: 1234", "seed: !secret 1234"), 8, "tag '!secret'"),
    ("empty-file", lambda t: "", None, "start from scenarios/quickstart.yaml"),
    ("list-not-mapping", lambda t: "- a\n- b\n", 1, "expected a mapping of version, name"),
    ("no-version", sub("version: 1\n", ""), None, "add 'version: 1'"),
    ("version-2", sub("version: 1", "version: 2"), 5, "add 'version: 1'"),
    ("path-escape-name", sub("name: quickstart", "name: ../../etc/passwd"), 6, "letters, digits"),
    ("name-spaces", sub("name: quickstart", "name: my scenario"), 6, "letters, digits"),
    ("seed-negative", sub("seed: 1234", "seed: -1"), 8, "out of range"),
    ("seed-text", sub("seed: 1234", "seed: abc"), 8, "expected an integer"),
    ("seed-float", sub("seed: 1234", "seed: 1.5"), 8, "expected an integer"),
    ("unknown-top", lambda t: t + "extra: 1\n", 35, "known fields: version"),
    ("typo-top", sub("expect:", "expekt:"), 30, "did you mean 'expect'"),
    ("duplicate-key", sub("seed: 1234", "seed: 1234\nseed: 5"), 9, "appears twice"),
    ("unknown-preset", sub("preset: atlas-900-a3", "preset: atlas-9000"), 10, "Did you mean 'atlas-900-a3'"),
    ("supernodes-zero", sub("supernodes: 2", "supernodes: 0"), 11, "between 1 and 64"),
    ("npus-too-many", sub("npus_per_supernode: 4", "npus_per_supernode: 500"), 12, "between 1 and 384"),
    ("npus-text", sub("npus_per_supernode: 4", "npus_per_supernode: four"), 12, "expected an integer"),
    ("device-memory", add_after("  npus_per_supernode: 4", "  device_memory: 12 potatoes"), 13, "'16MiB'"),
    ("cluster-typo", sub("npus_per_supernode: 4", "npus_per_supernod: 4"), 12, "did you mean"),
    ("modelled-npus-neg", add_after("  npus_per_supernode: 4", "  modelled_npus: -5"), 13, "out of range"),
    ("unknown-workload", sub("name: mlp", "name: gpt5"), 14, "Known: mlp, transformer"),
    ("steps-zero", sub("steps: 40", "steps: 0"), 15, "between 1 and"),
    ("layout-misfit", sub("dp: 8", "dp: 6"), 16, "make the product 8"),
    ("layout-unknown-axis", sub("parallel: {dp: 8}", "parallel: {dp: 8, cp: 2}"), 16, "known fields: dp, tp"),
    ("hidden-text", sub("hidden: 64", "hidden: big"), 17, "non-negative number"),
    ("compute-scale-neg", add_after("  layers: 2", "  compute_scale: -1"), 19, "out of range"),
    ("exponent-unsigned", add_after("  layers: 2", "  compute_scale: 2.0e9"), 19, "write 2.0e+7"),
    ("every-negative", sub("every: 10", "every: -10"), 21, "at least 0"),
    ("include-typo", sub("include: [params,", "include: [parms,"), 22, "Did you mean 'params'"),
    (
        "restore-unsaved",
        sub(
            "include: [params, optimizer, lr_scheduler, rng, data_cursor]",
            "include: [params]\n    restore: [rng]",
        ),
        23,
        "add it to include",
    ),
    ("connect-too-low", sub("connect_s: 120", "connect_s: 60"), 23, "between 120 and 7200"),
    ("connect-too-high", sub("connect_s: 120", "connect_s: 9000"), 23, "between 120 and 7200"),
    ("exec-zero", sub("exec_s: 1836", "exec_s: 0"), 23, "at least 1"),
    ("rdma-range", sub("exec_s: 1836}", "exec_s: 1836, rdma_timeout: 40}"), 23, "between 5 and 24"),
    ("learn-factor", sub("exec_s: 1836}", "exec_s: 1836, learn: {safety_factor: 0.5}}"), 23, "out of range"),
    ("heartbeat-zero", sub("heartbeat_s: 5", "heartbeat_s: 0"), 24, "at least 0.001"),
    ("missed-float", sub("missed: 3", "missed: 2.5"), 24, "expected an integer"),
    ("strategy-unknown", sub("strategy: restart", "strategy: reboot"), 25, "Known: elastic"),
    ("max-restarts-neg", sub("max_restarts: 3", "max_restarts: -1"), 25, "at least 0"),
    ("recovery-typo", sub("restart_s: 30", "restart_sec: 30"), 25, "did you mean 'restart_s'"),
    ("memory-policy", sub("  recovery:", "  memory: {on_oom: pray}\n  recovery:"), 25, "Known: defragment"),
    (
        "algorithm",
        sub("  recovery:", "  collectives: {algorithm: tree}\n  recovery:"),
        25,
        "Known: auto, ring",
    ),
    ("fault-kind-typo", sub("kind: node_kill", "kind: node_kil"), 27, "Did you mean 'node_kill'"),
    ("fault-rank-out", sub("rank: 5", "rank: 8"), 28, "ranks are 0..7"),
    ("fault-rank-neg", sub("rank: 5", "rank: -1"), 28, "ranks are 0..7"),
    ("fault-step-out", sub("step: 27", "step: 41"), 29, "N in 1..40, got 41"),
    ("fault-step-text", sub("step: 27", "step: soon"), 29, "N in 1..40, got 'soon'"),
    ("fault-during", sub("during: allreduce", "during: optimizer"), 29, "use one of boundary, forward"),
    ("fault-during-list", sub("during: allreduce", "during: []"), 29, "use one of boundary, forward"),
    ("fault-target-empty", sub("target: {rank: 5}", "target: {}"), 28, "'{mode: M, value: V}'"),
    (
        "fault-mode-typo",
        sub("target: {rank: 5}", "target: {mode: fixed-percnt, value: 10}"),
        28,
        "unknown mode",
    ),
    ("fault-mode-no-value", sub("target: {rank: 5}", "target: {mode: fixed}"), 28, "whole number of ranks"),
    (
        "fault-mode-percent",
        sub("target: {rank: 5}", "target: {mode: fixed-percent, value: 150}"),
        28,
        "(0, 100]",
    ),
    ("fault-blast-radius", sub("target: {rank: 5}", "target: {mode: all}"), 28, "blast_radius_percent"),
    ("fault-every-zero", sub("step: 27", "every: 0"), 29, "every must be a whole number"),
    ("fault-every-and-step", sub("step: 27", "step: 3, every: 5"), 29, "give one trigger"),
    ("fault-time-text", sub("step: 27", "time: soon"), 29, "positive duration"),
    ("fault-time-and-step", sub("step: 27", "step: 27, time: 1h"), 29, "cannot go with time"),
    ("policy-duration-typo", sub("exec_s: 1836", "exec_s: 3 minutes"), 23, "a duration like"),
    ("fault-supernode-out", sub("target: {rank: 5}", "target: {supernode: 2}"), 28, "in 0..1"),
    ("faults-not-list", sub(FAULT, "  kind: node_kill\n"), 26, "expected a list of faults"),
    (
        "fault-unknown-param",
        add_after("    at: {step: 27, during: allreduce}", "    force: 3"),
        30,
        "known fields",
    ),
    ("fault-mtbf", sub("at: {step: 27, during: allreduce}", "at: {mtbf: never}"), 29, "like 3600 or '1h'"),
    (
        "fault-scope",
        add_after("    at: {step: 27, during: allreduce}", "    scope: rack"),
        30,
        "process or ray_node",
    ),
    ("expect-typo", sub("recovered: true", "recoverd: true"), 31, "did you mean 'recovered'"),
    ("expect-bool-text", sub("recovered: true", "recovered: yes please"), 31, "expected true or false"),
    ("expect-negative", sub("max_recovery_s: 600", "max_recovery_s: -5"), 32, "at least 0"),
]


def test_the_corpus_has_at_least_forty_cases() -> None:
    assert len(CORPUS) >= 40 and len({c[0] for c in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize(("mutate", "line", "needle"), [c[1:] for c in CORPUS], ids=[c[0] for c in CORPUS])
def test_a_malformed_scenario_is_refused_with_254_naming_its_line_and_the_fix(
    mutate: Callable[[str], str],
    line: int | None,
    needle: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(mutate(BASE))
    assert main(["validate", str(path)]) == 254
    err = capsys.readouterr().err
    assert needle in err, err
    if line is not None:
        assert f"s.yaml:{line}" in err, err
    assert "Traceback" not in err


# --- fuzz: mutate library scenarios at the YAML level ----------------------------------------------

LIBRARY = [p.read_text() for p in sorted(SCENARIOS.glob("*.yaml"))]
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=6), st.integers(-3, 3), max_size=2),
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _mutated(data: st.DataObject) -> str:
    raw = yaml.safe_load(data.draw(st.sampled_from(LIBRARY)))
    for _ in range(data.draw(st.integers(1, 3))):
        paths = _paths(raw)
        where = data.draw(st.sampled_from(paths))
        parent = raw
        for key in where[:-1]:
            parent = parent[key]
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "delete" and isinstance(parent, dict):
            del parent[where[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[data.draw(st.text(min_size=1, max_size=10))] = data.draw(JUNK)
        else:
            parent[where[-1]] = data.draw(JUNK)
    return yaml.safe_dump(raw)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_mutated_library_scenario_gives_a_scenario_or_a_clear_error_never_a_traceback(
    data: st.DataObject,
) -> None:
    text = _mutated(data)
    try:
        parse_scenario(text, "fuzz.yaml")
    except ScenarioError as exc:
        assert str(exc).startswith("fuzz.yaml")


def test_a_hang_whose_during_is_not_a_name_is_refused_not_a_crash() -> None:
    text = (SCENARIOS / "hang.yaml").read_text().replace("during: allreduce", "during: [allreduce]")
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text, "h.yaml")
    assert "is not a point hang knows; use one of boundary, forward" in str(err.value)
