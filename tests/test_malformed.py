"""A corpus of malformed scenarios: each is refused with exit 254 and a message naming its line and the
fix; and a fuzz test: mutated library scenarios give a scenario or a ScenarioError, never a traceback."""

from __future__ import annotations

import copy
import re
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.cli import main
from testbed.core.errors import ScenarioError
from testbed.scenario.parse import parse_scenario
from tests.conftest import SCENARIOS
from tests.test_cli import cli_in_process

BASE = (SCENARIOS / "quickstart.yaml").read_text()
FAULT = "  - kind: node_kill\n    target: {rank: 5}\n    at: {step: 27, during: allreduce}\n"


def sub(old: str, new: str) -> Callable[[str], str]:
    def mutate(text: str) -> str:
        assert old in text, old
        return text.replace(old, new)

    return mutate


def add_after(anchor: str, line: str) -> Callable[[str], str]:
    return sub(anchor, anchor + "\n" + line)


def bomb(opening: str, closing: str, keyed: bool = False) -> str:
    """Nine anchors, each nine uses of the one before: 9**9 values once expanded."""

    def items(name: str) -> str:
        uses = [f"k{i}: *{name}" if keyed else f"*{name}" for i in range(9)]
        return opening + ", ".join(uses) + closing

    first = opening + ", ".join(f"k{i}: 1" if keyed else "1" for i in range(9)) + closing
    lines = [f"a: &a {first}"] + [f"{chr(98 + i)}: &{chr(98 + i)} {items(chr(97 + i))}" for i in range(8)]
    return "\n".join(lines) + "\n"


def fault(kind: str, target: str, at: str, extra: str) -> str:
    return f"  - kind: {kind}\n    target: {target}\n    at: {at}\n    {extra}\n"


TRANSFORMER = "  name: transformer\n  moe_every: 2\n  experts: 100000000\n  expert_ffn: 1024\n"


#: (id, mutation of the quick start, the line the message must name, what the message must say)
CORPUS: list[tuple[str, Callable[[str], str], int | None, str]] = [
    ("yaml-syntax", sub("recovery: {", "recovery: {{"), 34, "not valid YAML"),
    ("tab-indent", sub("  preset:", "\tpreset:"), 13, "Check the indentation"),
    (
        "object-tag",
        sub("seed: 1234", "seed: !!python/object/apply:os.system ['true']"),
        11,
        "plain data only",
    ),
    ("custom-tag", sub("seed: 1234", "seed: !secret 1234"), 11, "tag '!secret'"),
    ("empty-file", lambda t: "", None, "start from scenarios/quickstart.yaml"),
    ("list-not-mapping", lambda t: "- a\n- b\n", 1, "expected a mapping of version, name"),
    ("no-version", sub("version: 1\n", ""), None, "add 'version: 1'"),
    ("version-2", sub("version: 1", "version: 2"), 7, "add 'version: 1'"),
    ("path-escape-name", sub("name: quickstart", "name: ../../etc/passwd"), 8, "letters, digits"),
    ("name-spaces", sub("name: quickstart", "name: my scenario"), 8, "letters, digits"),
    ("seed-negative", sub("seed: 1234", "seed: -1"), 11, "out of range"),
    ("seed-text", sub("seed: 1234", "seed: abc"), 11, "expected an integer"),
    ("seed-float", sub("seed: 1234", "seed: 1.5"), 11, "expected an integer"),
    ("unknown-top", lambda t: t + "extra: 1\n", 43, "known fields: version"),
    ("typo-top", sub("expect:", "expekt:"), 38, "did you mean 'expect'"),
    ("duplicate-key", sub("seed: 1234", "seed: 1234\nseed: 5"), 12, "appears twice"),
    ("unknown-preset", sub("preset: atlas-900-a3", "preset: atlas-9000"), 13, "Did you mean 'atlas-900-a3'"),
    ("supernodes-zero", sub("supernodes: 2", "supernodes: 0"), 14, "between 1 and 64"),
    ("npus-too-many", sub("npus_per_supernode: 4", "npus_per_supernode: 500"), 15, "between 1 and 384"),
    ("npus-text", sub("npus_per_supernode: 4", "npus_per_supernode: four"), 15, "expected an integer"),
    ("device-memory", add_after("  npus_per_supernode: 4", "  device_memory: 12 potatoes"), 16, "'16MiB'"),
    ("cluster-typo", sub("npus_per_supernode: 4", "npus_per_supernod: 4"), 15, "did you mean"),
    ("modelled-npus-neg", add_after("  npus_per_supernode: 4", "  modelled_npus: -5"), 16, "out of range"),
    ("unknown-workload", sub("name: mlp", "name: gpt5"), 17, "Known: mlp, transformer"),
    ("steps-zero", sub("steps: 40", "steps: 0"), 18, "between 1 and"),
    ("layout-misfit", sub("dp: 8", "dp: 6"), 19, "make the product 8"),
    ("layout-unknown-axis", sub("parallel: {dp: 8}", "parallel: {dp: 8, cp: 2}"), 19, "known fields: dp, tp"),
    ("hidden-text", sub("hidden: 64", "hidden: big"), 20, "non-negative number"),
    ("compute-scale-neg", add_after("  layers: 2", "  compute_scale: -1"), 22, "out of range"),
    ("exponent-unsigned", add_after("  layers: 2", "  compute_scale: 2.0e9"), 22, "write 2.0e+7"),
    ("every-negative", sub("every: 10", "every: -10"), 29, "at least 0"),
    ("include-typo", sub("include: [params,", "include: [parms,"), 30, "Did you mean 'params'"),
    (
        "restore-unsaved",
        sub(
            "include: [params, optimizer, lr_scheduler, rng, data_cursor]",
            "include: [params]\n    restore: [rng]",
        ),
        31,
        "add it to include",
    ),
    ("connect-too-low", sub("connect_s: 120", "connect_s: 60"), 31, "between 120 and 7200"),
    ("connect-too-high", sub("connect_s: 120", "connect_s: 9000"), 31, "between 120 and 7200"),
    ("exec-zero", sub("exec_s: 1836", "exec_s: 0"), 31, "at least 1"),
    ("rdma-range", sub("exec_s: 1836}", "exec_s: 1836, rdma_timeout: 40}"), 31, "between 5 and 24"),
    ("learn-factor", sub("exec_s: 1836}", "exec_s: 1836, learn: {safety_factor: 0.5}}"), 31, "out of range"),
    ("heartbeat-zero", sub("heartbeat_s: 5", "heartbeat_s: 0"), 32, "at least 0.001"),
    ("missed-float", sub("missed: 3", "missed: 2.5"), 32, "expected an integer"),
    ("strategy-unknown", sub("strategy: restart", "strategy: reboot"), 33, "Known: elastic"),
    ("max-restarts-neg", sub("max_restarts: 3", "max_restarts: -1"), 33, "at least 0"),
    ("recovery-typo", sub("restart_s: 30", "restart_sec: 30"), 33, "did you mean 'restart_s'"),
    ("memory-policy", sub("  recovery:", "  memory: {on_oom: pray}\n  recovery:"), 33, "Known: defragment"),
    (
        "algorithm",
        sub("  recovery:", "  collectives: {algorithm: tree}\n  recovery:"),
        33,
        "Known: auto, ring",
    ),
    ("fault-kind-typo", sub("kind: node_kill", "kind: node_kil"), 35, "Did you mean 'node_kill'"),
    ("fault-rank-out", sub("rank: 5", "rank: 8"), 36, "ranks are 0..7"),
    ("fault-rank-neg", sub("rank: 5", "rank: -1"), 36, "ranks are 0..7"),
    ("fault-step-out", sub("step: 27", "step: 41"), 37, "N in 1..40, got 41"),
    ("fault-step-text", sub("step: 27", "step: soon"), 37, "N in 1..40, got 'soon'"),
    ("fault-during", sub("during: allreduce", "during: optimizer"), 37, "use one of boundary, forward"),
    ("fault-during-list", sub("during: allreduce", "during: []"), 37, "use one of boundary, forward"),
    ("fault-target-empty", sub("target: {rank: 5}", "target: {}"), 36, "'{mode: M, value: V}'"),
    (
        "fault-mode-typo",
        sub("target: {rank: 5}", "target: {mode: fixed-percnt, value: 10}"),
        36,
        "unknown mode",
    ),
    ("fault-mode-no-value", sub("target: {rank: 5}", "target: {mode: fixed}"), 36, "whole number of ranks"),
    (
        "fault-mode-percent",
        sub("target: {rank: 5}", "target: {mode: fixed-percent, value: 150}"),
        36,
        "(0, 100]",
    ),
    ("fault-blast-radius", sub("target: {rank: 5}", "target: {mode: all}"), 36, "blast_radius_percent"),
    ("fault-every-zero", sub("step: 27", "every: 0"), 37, "every must be a whole number"),
    ("fault-every-and-step", sub("step: 27", "step: 3, every: 5"), 37, "give one trigger"),
    ("fault-time-text", sub("step: 27", "time: soon"), 37, "positive duration"),
    ("fault-time-and-step", sub("step: 27", "step: 27, time: 1h"), 37, "cannot go with time"),
    ("policy-duration-typo", sub("exec_s: 1836", "exec_s: 3 minutes"), 31, "a duration like"),
    ("fault-supernode-out", sub("target: {rank: 5}", "target: {supernode: 2}"), 36, "in 0..1"),
    ("faults-not-list", sub(FAULT, "  kind: node_kill\n"), 34, "expected a list of faults"),
    (
        "fault-unknown-param",
        add_after("    at: {step: 27, during: allreduce}", "    force: 3"),
        38,
        "known fields",
    ),
    ("fault-mtbf", sub("at: {step: 27, during: allreduce}", "at: {mtbf: never}"), 37, "like 3600 or '1h'"),
    (
        "fault-scope",
        add_after("    at: {step: 27, during: allreduce}", "    scope: rack"),
        38,
        "process or ray_node",
    ),
    ("expect-typo", sub("recovered: true", "recoverd: true"), 39, "did you mean 'recovered'"),
    ("expect-bool-text", sub("recovered: true", "recovered: yes please"), 39, "expected true or false"),
    ("expect-negative", sub("max_recovery_s: 600", "max_recovery_s: -5"), 40, "at least 0"),
    # what a file may cost: bounded before anything is built from it
    ("alias-bomb-lists", lambda t: bomb("[", "]"), 5, "alias bomb"),
    ("alias-bomb-maps", lambda t: bomb("{", "}", keyed=True), 5, "alias bomb"),
    (
        "alias-bomb-nested",
        lambda t: t + "x:\n" + "".join("  " + b + "\n" for b in bomb("[", "]").splitlines()),
        48,
        "alias bomb",
    ),
    (
        "deep-flow-lists",
        lambda t: t.replace("seed: 1234", "seed: " + "[" * 3000 + "]" * 3000),
        11,
        "nests more",
    ),
    (
        "deep-flow-maps",
        lambda t: t.replace("seed: 1234", "seed: " + "{a: " * 200 + "1" + "}" * 200),
        11,
        "nests",
    ),
    (
        "deep-block",
        lambda t: t + "".join(" " * (2 * i) + f"k{i}:\n" for i in range(40)) + " " * 80 + "x: 1\n",
        75,
        "nests",
    ),
    ("deep-dashes", lambda t: t + "y:\n" + "- " * 500 + "x\n", 44, "nests more"),
    ("huge-file", lambda t: t + "# " + "padding " * 40_000 + "\n", None, "more than a scenario may be"),
    ("int-too-long", sub("seed: 1234", "seed: " + "9" * 5000), 11, "too long to read"),
    # every kind of number field refuses NaN and infinity
    ("nan-integer", sub("seed: 1234", "seed: .nan"), 11, ".nan is not a finite number"),
    ("inf-integer-field", sub("steps: 40", "steps: .inf"), 18, ".inf is not a finite number"),
    ("nan-float", add_after("  layers: 2", "  compute_scale: .nan"), 22, ".nan is not a finite"),
    ("inf-float", add_after("  layers: 2", "  state_scale: .inf"), 22, ".inf is not a finite"),
    ("nan-option", sub("hidden: 64", "hidden: .nan"), 20, ".nan is not a finite"),
    ("inf-duration", sub("exec_s: 1836", "exec_s: .inf"), 31, ".inf is not a finite"),
    ("neg-inf-duration", sub("restart_s: 30", "restart_s: -.inf"), 33, "-.inf is not a finite"),
    ("nan-share", sub("  recovery:", "  memory: {on_oom: pool, pool_share: .nan}\n  recovery:"), 33, ".nan"),
    ("nan-learn", sub("exec_s: 1836}", "exec_s: 1836, learn: {blend: .nan}}"), 31, ".nan is not a finite"),
    ("inf-device-memory", add_after("  npus_per_supernode: 4", "  device_memory: .inf"), 16, ".inf is not"),
    ("nan-step", sub("step: 27,", "step: .nan,"), 37, ".nan is not a finite"),
    ("nan-target-value", sub("target: {rank: 5}", "target: {mode: fixed-percent, value: .nan}"), 36, ".nan"),
    (
        "nan-straggler-factor",
        sub(FAULT, fault("straggler", "{rank: 1}", "{step: 3}", "factor: .nan")),
        38,
        ".nan",
    ),
    (
        "inf-setup-delay",
        sub(FAULT, fault("link_setup_delay", "{link: [0, 4]}", "{step: 3}", "delay: .inf")),
        38,
        ".inf",
    ),
    (
        "nan-bandwidth",
        sub(FAULT, fault("link_degrade", "{link: [0, 4]}", "{step: 3}", "bandwidth_factor: .nan")),
        38,
        ".nan",
    ),
    (
        "inf-pause",
        sub(FAULT, fault("checkpoint_pause", "{rank: 1}", "{step: 10}", "pause: .inf")),
        38,
        ".inf",
    ),
    ("inf-mtbf", sub("at: {step: 27, during: allreduce}", "at: {mtbf: .inf}"), 37, ".inf is not a finite"),
    ("inf-expect-range", sub("max_recovery_s: 600", "goodput: [0.1, .inf]"), 40, ".inf is not a finite"),
    ("nan-expect", sub("max_recovery_s: 600", "max_recovery_s: .nan"), 40, ".nan is not a finite"),
    (
        "inf-safeguard",
        lambda t: t + "safeguards: {wall_s: .inf, blast_radius_percent: .nan}\n",
        43,
        ".inf is not",
    ),
    # models, data sets and device memory too big for this machine
    ("model-too-big", sub("hidden: 64", "hidden: 1000000000"), 16, "one NPU process would hold"),
    ("data-too-big", add_after("  layers: 2", "  samples: 1000000000000"), 16, "one NPU process would hold"),
    ("experts-too-big", sub("  name: mlp\n", TRANSFORMER), 16, "one NPU process would hold"),
    ("device-memory-over-hbm", add_after("  npus_per_supernode: 4", "  device_memory: 1TiB"), 16, "of HBM"),
    # what a suite reads: declared verdicts and tags
    ("verdict-unknown", add_after("  recovered: true", "  verdict: maybe"), 40, "Known: pass, fail"),
    ("verdict-fail-unnamed", add_after("  recovered: true", "  verdict: fail"), 40, "add 'fails: [CHECK"),
    (
        "fails-unknown-check",
        add_after("  recovered: true", "  fails: [recoverd]"),
        40,
        "Did you mean 'recovered'",
    ),
    (
        "fails-with-pass",
        add_after("  recovered: true", "  verdict: pass\n  fails: [recovered]"),
        41,
        "not with verdict",
    ),
    ("tags-bad", lambda t: t + "tags: [Smoke Test]\n", 43, "short lower-case labels"),
]


def test_the_corpus_has_at_least_eighty_cases() -> None:
    assert len(CORPUS) >= 80 and len({c[0] for c in CORPUS}) == len(CORPUS)


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


def _first_fault_of_each_kind() -> dict[str, tuple[dict[str, Any], int]]:
    """Each fault kind the library uses: a scenario (parsed YAML) and the index of its fault."""
    found: dict[str, tuple[dict[str, Any], int]] = {}
    for text in LIBRARY:
        raw = yaml.safe_load(text)
        for i, fault in enumerate(raw.get("faults") or []):
            found.setdefault(str(fault["kind"]), (raw, i))
    return found


@pytest.mark.parametrize("shape", [[1, 2], {"a": 1}], ids=["list", "mapping"])
def test_every_fault_param_given_a_list_or_a_mapping_is_refused_never_a_traceback(shape: Any) -> None:
    """Hashing a parameter to look it up in a table of choices raised TypeError on a list: every
    parameter, target and trigger key of every fault kind the library uses, each given a collection
    where a scalar goes."""
    from faults.kind import kinds

    registry = kinds()
    refused = 0
    for kind, (raw, index) in sorted(_first_fault_of_each_kind().items()):
        fault = raw["faults"][index]
        params = [(p,) for p in sorted(set(registry[kind].params) | (set(fault) - {"kind", "target", "at"}))]
        for section in ("target", "at"):
            params += [(section, k) for k in sorted(fault.get(section) or {})]
        for path in params:
            mutated = copy.deepcopy(raw)
            *within, last = path
            node = mutated["faults"][index]
            for key in within:
                node = node[key]
            node[last] = copy.deepcopy(shape)
            try:
                parse_scenario(yaml.safe_dump(mutated), "fuzz.yaml")
            except ScenarioError as exc:
                assert str(exc).startswith("fuzz.yaml"), (kind, path, str(exc))
                refused += 1
    assert refused >= 40  # most parameters are scalars: a collection is refused, by name


def test_a_hang_whose_during_is_not_a_name_is_refused_not_a_crash() -> None:
    text = (SCENARIOS / "hang.yaml").read_text().replace("during: allreduce", "during: [allreduce]")
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text, "h.yaml")
    assert "is not a point hang knows; use one of boundary, forward" in str(err.value)


def test_an_alias_bomb_is_refused_before_it_is_expanded() -> None:
    tracemalloc.start()
    try:
        with pytest.raises(ScenarioError) as err:
            parse_scenario(bomb("[", "]"), "bomb.yaml")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "bomb.yaml:5:" in str(err.value) and "50,000 values" in str(err.value)
    assert peak < 20 * 2**20, f"refusing the bomb took {peak / 2**20:.1f} MiB"


#: clusters a scenario may describe but this machine cannot hold: ``testbed run`` refuses them at once
BIG_CLUSTERS = [
    ("64x384", 64, 384),  # 24,576 NPU processes: a fine scenario for a Ray cluster of many hosts
    ("32x4-big-model", 32, 4),  # 128 processes, each with a 2048-wide model: too much for one host
]


@pytest.mark.parametrize(
    ("supernodes", "npus"), [c[1:] for c in BIG_CLUSTERS], ids=[c[0] for c in BIG_CLUSTERS]
)
def test_a_cluster_this_machine_cannot_hold_is_refused_by_run_before_ray_starts(
    supernodes: int, npus: int, tmp_path: Path
) -> None:
    text = (
        re.sub(r"job:\n(  .*\n)+", "", BASE)  # the job's global batch would not split over these ranks
        .replace("supernodes: 2", f"supernodes: {supernodes}")
        .replace("npus_per_supernode: 4", f"npus_per_supernode: {npus}")
        .replace("dp: 8", f"dp: {supernodes * npus}")
        .replace("hidden: 64", "hidden: 2048")
        .replace("layers: 2", "layers: 12")
    )
    path = tmp_path / "big.yaml"
    path.write_text(text)
    assert main(["validate", str(path)]) == 0  # a fine scenario for a Ray cluster
    proc = cli_in_process("run", str(path), "--out", str(tmp_path / "out"))
    assert proc.returncode == 254, proc.stderr
    at = text.splitlines().index("cluster:") + 1
    assert f"{path}:{at}: cluster: a local run needs about" in proc.stderr
    assert "this machine has" in proc.stderr and "--address" in proc.stderr
    assert "Traceback" not in proc.stderr and "NO_RAY" in proc.stdout
    assert not (tmp_path / "out").exists()


MISSING_SECTIONS = {
    "no-cluster": (
        "version: 1\nname: a\nworkload: {name: mlp, steps: 10, parallel: {dp: 16}}\n",
        "cluster: not written, so the problems above were judged against the default cluster "
        "(atlas-900-a3, 2 supernodes x 4 NPUs); add a 'cluster:' section, like cluster: {preset:",
    ),
    "no-workload": (
        "version: 1\nname: b\ncluster: {preset: atlas-800t-a2, supernodes: 2, npus_per_supernode: 8}\n"
        "faults: [{kind: node_kill, target: {rank: 5}, at: {step: 187}}]\n",
        "workload: not written, so the problems above were judged against the default workload (mlp, 60 "
        "steps, dp16 x tp1 x pp1 x ep1); add a 'workload:' section, like workload: {name: mlp",
    ),
    "no-name": (
        "version: 1\ncluster: {supernodes: 1, npus_per_supernode: 2}\nworkload: {parallel: {dp: 2}}\n",
        "name: no name: add 'name: my-job'",
    ),
}


@pytest.mark.parametrize("case", sorted(MISSING_SECTIONS))
def test_a_missing_section_is_named_with_how_to_add_it(case: str) -> None:
    text, needle = MISSING_SECTIONS[case]
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text, "s.yaml")
    assert needle in str(err.value)


def test_a_valid_scenario_without_those_sections_is_not_told_about_them() -> None:
    parse_scenario("version: 1\nname: c\nworkload: {steps: 4, parallel: {dp: 8}}\n")  # the defaults fit


@pytest.mark.parametrize("command", ["run", "sweep", "compare", "tune", "suite", "drill"])
@pytest.mark.parametrize("where", ["file", "under-a-file", "proc"])
def test_an_out_that_cannot_be_a_folder_exits_254_naming_it(
    tmp_path: Path, command: str, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "afile").write_text("")
    out = {"file": tmp_path / "afile", "under-a-file": tmp_path / "afile" / "x", "proc": Path("/proc/x")}[
        where
    ]
    scenario = str(SCENARIOS / ("drill.yaml" if command == "drill" else "quickstart.yaml"))
    extra = {"sweep": ["--values", "5,10"], "drill": ["--budget", "5s"]}.get(command, [])
    assert main([command, scenario, *extra, "--out", str(out)]) == 254
    err = capsys.readouterr().err
    assert f"--out {out}:" in err and ("not a folder" in err or "cannot make that folder" in err)
    assert "internal error" not in err and "Traceback" not in err
