"""The testbed's pytest plugin (registered through the ``pytest11`` entry point).

For users' own property tests over fault schedules:

- fixtures: ``ray_session`` (a private Ray on 127.0.0.1, started once per test
  session and shut down at its end, every process it started gone),
  ``testbed_run`` (runs a scenario on that Ray into the test's temporary
  directory and returns the :class:`~testbed.runner.RunResult`; each run
  starts its NPU actors afresh, so examples never share a cluster's state),
  ``drill_seed`` and ``drill_budget`` (from the command line);
- markers: ``chaos`` (runs real faults on Ray actors) and ``slow``;
- options: ``--drill-seed N`` and ``--drill-budget DURATION``;
- Hypothesis profiles: ``dev`` (50 examples), ``ci`` (100, derandomised, no
  example database, no deadline) and ``nightly`` (1000, no deadline); ``ci``
  is loaded when the ``CI`` environment variable is set, else the one named by
  ``HYPOTHESIS_PROFILE``, else ``dev``, unless ``--hypothesis-profile`` says
  otherwise.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

import testbed  # noqa: F401  (sets the loopback environment before ray is imported)
from testbed.raysession import RaySession
from testbed.units import parse_duration

if TYPE_CHECKING:  # the runner is imported when a test first runs a scenario, not at pytest's start
    from testbed.runner import RunResult
    from testbed.scenario import Scenario

settings.register_profile("dev", max_examples=50, deadline=None)
settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "nightly", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def default_profile() -> str:
    """``ci`` under CI, else ``$HYPOTHESIS_PROFILE``, else ``dev``."""
    return "ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev")


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--drill-seed`` and ``--drill-budget``."""
    group = parser.getgroup("testbed", "training-resilience testbed")
    group.addoption("--drill-seed", type=int, default=0, help="seed of drills run from tests (default 0)")
    group.addoption(
        "--drill-budget", default="60s", help="time budget of a drill run from tests (default 60s)"
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers; load the Hypothesis profile unless one was asked for."""
    config.addinivalue_line("markers", "chaos: runs real faults on Ray actors (seconds per test)")
    config.addinivalue_line("markers", "slow: takes more than about 30 s")
    if not config.getoption("hypothesis_profile", default=None):
        settings.load_profile(default_profile())


@pytest.fixture(scope="session")
def ray_session() -> Iterator[RaySession]:
    """A private local Ray on 127.0.0.1, started once per test session."""
    with RaySession() as session:
        yield session


@pytest.fixture
def testbed_run(ray_session: RaySession, tmp_path: Path) -> Callable[[Scenario], RunResult]:
    """Run a scenario on the session's Ray into a fresh directory under the test's ``tmp_path``."""
    from testbed.runner import run

    count = itertools.count(1)

    def go(scenario: Scenario) -> RunResult:
        return run(scenario, tmp_path / f"run-{next(count):03d}")

    return go


@pytest.fixture
def drill_seed(request: pytest.FixtureRequest) -> int:
    """The drill seed given with ``--drill-seed`` (default 0)."""
    return int(request.config.getoption("drill_seed"))


@pytest.fixture
def drill_budget(request: pytest.FixtureRequest) -> float:
    """The drill budget in seconds, from ``--drill-budget`` (default 60 s)."""
    text = request.config.getoption("drill_budget")
    seconds = parse_duration(text)
    if seconds is None or seconds <= 0:
        raise pytest.UsageError(f"--drill-budget {text!r} is not a positive duration; write 90s or 5m")
    return seconds
