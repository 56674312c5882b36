"""Shared fixtures: one Ray instance for the whole session, and Hypothesis profiles."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

import testbed  # noqa: F401  (sets the loopback environment before ray is imported)
from testbed.raysession import RaySession

settings.register_profile("dev", max_examples=50, deadline=None)
settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"


@pytest.fixture(scope="session")
def ray_session() -> Iterator[RaySession]:
    """A private local Ray on 127.0.0.1, started once per test session."""
    with RaySession() as session:
        yield session
