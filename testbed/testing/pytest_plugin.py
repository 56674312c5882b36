"""The testbed's pytest plugin (registered through the ``pytest11`` entry point).

For users' own property tests over fault schedules:

- fixtures: ``ray_session`` (a private Ray on 127.0.0.1, started once per test
  session and shut down at its end, every process it started gone),
  ``testbed_run`` (runs a scenario on that Ray into the test's temporary
  directory and returns the :class:`~testbed.report.run_report.Report`; each run
  forks its NPU processes afresh, so examples never share a cluster's state; the
  supernode actors that host them are kept for the next run once every process
  and line of the last one is gone, which saves about a second of CPU per
  supernode per run),
  ``testbed_runs`` (the same for the whole session, for Hypothesis ``@given``
  tests, which refuse function-scoped fixtures),
  ``drill_seed`` and ``drill_budget`` (from the command line);
- markers: ``chaos`` (runs real faults on Ray actors) and ``slow``;
- options: ``--drill-seed N`` and ``--drill-budget DURATION``;
- Hypothesis profiles, when the project asks for them with the ini option
  ``testbed_hypothesis_profiles = true``: ``dev`` (50 examples), ``ci`` (100,
  derandomised, no example database, no deadline) and ``nightly`` (1000, no
  deadline); ``ci`` is loaded when the ``CI`` environment variable is set, else
  the one named by ``HYPOTHESIS_PROFILE``, else ``dev``, unless
  ``--hypothesis-profile`` says otherwise.

Every pytest session in an environment where the testbed is installed loads
this module, so it does nothing a session did not ask for: it imports only
pytest at load time, changes no environment variable, and leaves Hypothesis'
settings alone unless the ini option asks. The testbed itself (Ray, numpy,
the runner) is imported when a fixture is first used; if that import fails,
the test that used the fixture errors with what is missing and how to install
it, and every other test runs as before.
"""

from __future__ import annotations

import importlib
import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from testbed.actors.session import RaySession
    from testbed.report.run_report import Report
    from testbed.scenario.model import Scenario

#: The ini option that loads the testbed's Hypothesis profiles.
PROFILES_INI = "testbed_hypothesis_profiles"


def _import(module: str) -> ModuleType:
    """Import a module of the testbed for a fixture; a clear test error, not a traceback, if it fails."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        failure = f"'{exc.name or module}', which cannot be imported here ({exc})"
    pytest.fail(
        f"the testbed's fixtures need {failure}; install the testbed with its dependencies: "
        "pip install supernode-testbed",
        pytrace=False,
    )


def register_profiles() -> None:
    """Register the Hypothesis profiles ``dev``, ``ci`` and ``nightly``."""
    hypothesis = _import("hypothesis")
    settings, health = hypothesis.settings, hypothesis.HealthCheck
    settings.register_profile("dev", max_examples=50, deadline=None)
    settings.register_profile(
        "ci",
        max_examples=100,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[health.too_slow],
    )
    settings.register_profile(
        "nightly", max_examples=1000, deadline=None, suppress_health_check=[health.too_slow]
    )


def default_profile() -> str:
    """``ci`` under CI, else ``$HYPOTHESIS_PROFILE``, else ``dev``."""
    return "ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev")


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--drill-seed``, ``--drill-budget`` and the ini option that loads the Hypothesis profiles."""
    group = parser.getgroup("testbed", "training-resilience testbed")
    group.addoption("--drill-seed", type=int, default=0, help="seed of drills run from tests (default 0)")
    group.addoption(
        "--drill-budget", default="60s", help="time budget of a drill run from tests (default 60s)"
    )
    parser.addini(
        PROFILES_INI,
        type="bool",
        default=False,
        help="register and load the testbed's Hypothesis profiles (dev, ci, nightly)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers; with the ini option set, the Hypothesis profiles (one loaded, unless
    ``--hypothesis-profile`` names one)."""
    config.addinivalue_line("markers", "chaos: runs real faults on Ray actors (seconds per test)")
    config.addinivalue_line("markers", "slow: takes more than about 30 s")
    if not config.getini(PROFILES_INI):
        return
    register_profiles()
    if not config.getoption("hypothesis_profile", default=None):
        importlib.import_module("hypothesis").settings.load_profile(default_profile())


@pytest.fixture(scope="session")
def ray_session() -> Iterator[RaySession]:
    """A private local Ray on 127.0.0.1, started once per test session."""
    raysession: Any = _import("testbed.actors.session")  # first: it keeps Ray on loopback
    _import("ray")
    with raysession.RaySession() as session:
        yield session


@pytest.fixture
def testbed_run(ray_session: RaySession, tmp_path: Path) -> Callable[[Scenario], Report]:
    """Run a scenario on the session's Ray into a fresh directory under the test's ``tmp_path``."""
    runner: Any = _import("testbed.control.runner")
    count = itertools.count(1)

    def go(scenario: Scenario) -> Report:
        result: Report = runner.run(scenario, tmp_path / f"run-{next(count):03d}")
        return result

    return go


@pytest.fixture(scope="session")
def testbed_runs(
    ray_session: RaySession, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[Scenario], Report]:
    """``testbed_run`` for the whole session: each call runs a scenario into a fresh folder of the
    session's temporary directory. Session-scoped, so a Hypothesis ``@given`` test may take it (a
    function-scoped fixture would be shared by every example, which Hypothesis refuses)."""
    runner: Any = _import("testbed.control.runner")
    root = tmp_path_factory.mktemp("testbed-runs")
    count = itertools.count(1)

    def go(scenario: Scenario) -> Report:
        result: Report = runner.run(scenario, root / f"run-{next(count):04d}")
        return result

    return go


@pytest.fixture
def drill_seed(request: pytest.FixtureRequest) -> int:
    """The drill seed given with ``--drill-seed`` (default 0)."""
    return int(request.config.getoption("drill_seed"))


@pytest.fixture
def drill_budget(request: pytest.FixtureRequest) -> float:
    """The drill budget in seconds, from ``--drill-budget`` (default 60 s)."""
    units: Any = _import("testbed.core.units")
    text = request.config.getoption("drill_budget")
    seconds = units.parse_duration(text)
    if seconds is None or seconds <= 0:
        raise pytest.UsageError(f"--drill-budget {text!r} is not a positive duration; write 90s or 5m")
    return float(seconds)
