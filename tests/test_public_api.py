"""The public API: ``import testbed`` is free of side effects, every public name resolves to a
documented object, and the four registries take what they should and refuse what they should not,
with a message that names the fix."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import testbed
from testbed.core.errors import TestbedError
from testbed.core.registry import Registry
from tests.conftest import SCENARIOS


def test_importing_the_package_imports_nothing_else() -> None:
    code = (
        "import sys, os; before = set(sys.modules); env = dict(os.environ); import testbed; "
        "new = sorted(m for m in set(sys.modules) - before if m.split('.')[0] in "
        "('testbed', 'faults', 'workloads', 'ray', 'numpy')); "
        "print(new, env == dict(os.environ))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "['testbed'] True", done.stderr


def test_every_public_name_resolves_and_says_what_it_is() -> None:
    from testbed import _HOMES

    assert testbed.__all__ == sorted(_HOMES)
    for name in testbed.__all__:
        value = getattr(testbed, name)
        assert (value.__doc__ or "").strip(), f"testbed.{name} has no docstring"
    assert {"load_scenario", "run", "Report", "FaultKind", "register_fault_kind"} <= set(testbed.__all__)
    assert {"register_strategy", "register_check", "register_workload"} <= set(testbed.__all__)


def test_an_unknown_name_says_which_names_there_are() -> None:
    with pytest.raises(AttributeError, match=r"no attribute 'Runner'.*'load_scenario'"):
        _ = testbed.Runner  # type: ignore[attr-defined]


def test_a_scenario_loads_through_the_api() -> None:
    scenario = testbed.load_scenario(SCENARIOS / "quickstart.yaml").with_seed(7)
    assert isinstance(scenario, testbed.Scenario) and scenario.seed == 7
    with pytest.raises(testbed.ScenarioError, match="version"):
        testbed.parse_scenario("name: x\n")


def test_a_report_reads_back_from_its_directory(tmp_path: Path) -> None:
    data = {
        "verdict": "fail",
        "exit_code": 1,
        "checks": [
            {"name": "recovered", "status": "pass", "summary": "ok", "evidence": {}},
            {"name": "goodput", "status": "fail", "summary": "12% < 50%", "evidence": {"goodput": 0.12}},
        ],
    }
    (tmp_path / "report.json").write_text(json.dumps(data))
    report = testbed.Report.read(tmp_path)
    assert (report.verdict, report.exit_code, report.passed) == ("fail", 1, False)
    assert report.check("goodput").evidence == {"goodput": 0.12}
    with pytest.raises(KeyError, match=r"no check 'detection'.*recovered, goodput"):
        report.check("detection")
    with pytest.raises(testbed.ScenarioError, match="no report there"):
        testbed.Report.read(tmp_path / "nowhere")


# --- the registries -------------------------------------------------------------------------------


@pytest.fixture
def registries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The four registries as they are, restored after the test (what it registers goes away)."""
    from faults.kind import FAULT_KINDS, kinds
    from testbed.core.registry import CHECKS, STRATEGIES
    from workloads import WORKLOADS

    kinds()
    for registry in (FAULT_KINDS, STRATEGIES, CHECKS, WORKLOADS):
        list(registry)  # found what there is to find first
        monkeypatch.setattr(registry, "_items", dict(registry._items))
        monkeypatch.setattr(registry, "_sources", dict(registry._sources))


class _Kind(testbed.FaultKind):
    """A fault kind for these tests only."""

    name = "api_test_kind"
    description = "does nothing"


def _check(events: list[dict[str, Any]], expect: Any) -> testbed.CheckResult:
    """A check for these tests only."""
    return testbed.CheckResult("api_test_check", "pass", "fine")


@pytest.mark.usefixtures("registries")
def test_each_register_function_makes_its_thing_findable_by_name() -> None:
    from faults.kind import kinds
    from testbed.core.registry import CHECKS, STRATEGIES
    from workloads import WORKLOADS

    assert testbed.register_fault_kind(_Kind) is _Kind
    assert isinstance(kinds()["api_test_kind"], _Kind)
    strategy = testbed.Strategy("api_test_strategy", "restarts")
    assert testbed.register_strategy(strategy) is strategy and STRATEGIES["api_test_strategy"] is strategy
    assert testbed.register_check("api_test_check", _check) is _check and CHECKS["api_test_check"] is _check
    decorated = testbed.register_check("api_test_check_2")(_check)
    assert decorated is _check and CHECKS["api_test_check_2"] is _check
    info = testbed.WorkloadInfo("api_test_workload", "a copy of mlp", WORKLOADS["mlp"].factory, {})
    assert testbed.register_workload(info) is info and WORKLOADS["api_test_workload"] is info
    # the same thing twice is fine (a module imported twice); another thing under the name is not
    assert testbed.register_strategy(strategy) is strategy
    with pytest.raises(TestbedError, match=r"'api_test_strategy' is registered already.*another name"):
        testbed.register_strategy(testbed.Strategy("api_test_strategy", "another"))


@pytest.mark.parametrize(
    ("register", "thing", "fix"),
    [
        ("register_fault_kind", int, r"register a subclass of testbed\.FaultKind"),
        ("register_workload", "mlp", r"register a testbed\.WorkloadInfo"),
    ],
)
@pytest.mark.usefixtures("registries")
def test_a_register_function_refuses_what_is_not_its_thing(register: str, thing: Any, fix: str) -> None:
    with pytest.raises(TestbedError, match=fix):
        getattr(testbed, register)(thing)


@pytest.mark.usefixtures("registries")
def test_strategies_and_checks_refuse_what_they_cannot_run() -> None:
    from testbed.core.registry import CHECKS, STRATEGIES

    with pytest.raises(TestbedError, match=r"not a recovery strategy: register a testbed\.Strategy"):
        STRATEGIES.register("api_test_bad", object())
    with pytest.raises(TestbedError, match="not a check: register a function"):
        CHECKS.register("api_test_bad", 42)


def test_a_plugin_that_cannot_load_is_named_with_its_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    broken = EntryPoint("broken", "no_such_module_anywhere:THING", "testbed.api_test")

    def entry_points(group: str) -> list[EntryPoint]:
        return [broken] if group == "testbed.api_test" else []

    monkeypatch.setattr("testbed.core.registry.entry_points", entry_points)
    registry: Registry[Any] = Registry("testbed.api_test", "widget")
    with pytest.raises(
        TestbedError, match=r"widget 'broken'.*cannot be loaded.*uninstall the package"
    ) as err:
        list(registry)
    assert pickle.loads(pickle.dumps(err.value)).args == err.value.args


def test_entry_points_are_found_on_first_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    found = EntryPoint("mine", "json:dumps", "testbed.api_test2")
    whole = EntryPoint("whole", "json", "testbed.api_test2")  # a module registers its own things
    monkeypatch.setattr(
        "testbed.core.registry.entry_points",
        lambda group: [found, whole] if group == "testbed.api_test2" else [],
    )
    registry: Registry[Any] = Registry("testbed.api_test2", "check")
    registry.register("own", len)
    assert dict(registry.items()) == {"own": len, "mine": json.dumps}


def test_two_things_under_one_name_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    clash = EntryPoint("own", "json:dumps", "testbed.api_test3")
    monkeypatch.setattr(
        "testbed.core.registry.entry_points", lambda group: [clash] if group == "testbed.api_test3" else []
    )
    registry: Registry[Any] = Registry("testbed.api_test3", "check")
    registry.register("own", len)
    with pytest.raises(TestbedError, match=r"two checks are named 'own'.*json:dumps.*rename one"):
        list(registry)
