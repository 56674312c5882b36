"""Shared paths. The fixtures (``ray_session``, ``testbed_run``, ``drill_seed``, ``drill_budget``),
the markers and the Hypothesis profiles come from the testbed's own pytest plugin
(``testbed.testing.pytest_plugin``, registered through the ``pytest11`` entry point), as they do for
users' tests."""

from __future__ import annotations

from pathlib import Path

from testbed import keep_ray_on_loopback

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"

keep_ray_on_loopback()  # before any test imports ray
