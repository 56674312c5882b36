"""The pytest plugin: loaded through its entry point, with its options, markers, fixtures and profiles."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import settings

from testbed.scenario.parse import load_scenario
from testbed.testing.pytest_plugin import default_profile
from tests.conftest import SCENARIOS

pytest_plugins = ["pytester"]


def test_the_plugin_is_registered_through_its_entry_point(request: pytest.FixtureRequest) -> None:
    assert request.config.pluginmanager.has_plugin("testbed")
    markers = "\n".join(request.config.getini("markers"))
    assert "chaos:" in markers and "slow:" in markers


def test_the_profiles_exist_and_ci_is_derandomised_without_a_database() -> None:
    ci, nightly = settings.get_profile("ci"), settings.get_profile("nightly")
    assert ci.derandomize and ci.database is None and ci.deadline is None
    assert nightly.max_examples >= 10 * settings.get_profile("dev").max_examples
    assert default_profile() == (
        "ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev")
    )


def test_the_drill_options_reach_the_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_options(drill_seed, drill_budget):
            assert drill_seed == 42 and drill_budget == 150.0
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--drill-seed", "42", "--drill-budget", "2.5m")
    result.assert_outcomes(passed=1)
    bad = pytester.runpytest("-p", "no:cacheprovider", "--drill-budget", "soon")
    assert bad.ret != 0 and "not a positive duration" in bad.stdout.str() + bad.stderr.str()


@pytest.mark.chaos
def test_testbed_run_runs_a_scenario_on_the_session_ray(testbed_run: Any) -> None:
    result = testbed_run(load_scenario(SCENARIOS / "drill.yaml"))
    assert result.verdict == "pass" and (result.out_dir / "journal.jsonl").is_file()
    again = testbed_run(load_scenario(SCENARIOS / "drill.yaml"))
    assert again.out_dir != result.out_dir and again.data["final_digest"] == result.data["final_digest"]


UNRELATED = """
import os, sys

def test_an_ordinary_test():
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ
    assert "RAY_USAGE_STATS_ENABLED" not in os.environ
    assert not any(m == "ray" or m.startswith(("ray.", "numpy", "testbed.r")) for m in sys.modules)
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument
    try:
        settings.get_profile("nightly")
    except InvalidArgument:
        pass
    else:
        raise AssertionError("the testbed registered its Hypothesis profiles in a session that did not ask")
"""


def _without_ray_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_USAGE_STATS_ENABLED", "CI", "HYPOTHESIS_PROFILE"):
        monkeypatch.delenv(name, raising=False)


def test_an_unrelated_session_runs_as_before_its_environment_and_settings_untouched(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    _without_ray_environment(monkeypatch)
    pytester.makepyfile(test_unrelated=UNRELATED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    plugins = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--trace-config", "--co", "-q")
    assert (
        "testbed.testing.pytest_plugin" in plugins.stdout.str()
    )  # loaded through its entry point, and silent


def test_a_fixture_whose_imports_fail_errors_with_the_fix_and_other_tests_still_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    _without_ray_environment(monkeypatch)
    broken = pytester.mkpydir("ray")
    (broken / "__init__.py").write_text("raise ImportError('this ray is broken on purpose')\n")
    pytester.makepyfile(
        test_mixed="""
        def test_plain():
            assert 1 + 1 == 2

        def test_uses_the_testbed(ray_session):
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)
    out = result.stdout.str()
    assert "the testbed's fixtures need 'ray'" in out and "pip install supernode-testbed" in out
    assert "Traceback" not in out
