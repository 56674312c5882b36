"""Shared paths. The fixtures (``ray_session``, ``testbed_run``, ``drill_seed``, ``drill_budget``),
the markers and the Hypothesis profiles come from the testbed's own pytest plugin
(``testbed.testing.pytest_plugin``, registered through the ``pytest11`` entry point), as they do for
users' tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed import keep_ray_on_loopback

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"

keep_ray_on_loopback()  # before any test imports ray


#: The modules whose tests take longest (``pytest --durations``: whole scenarios of hundreds of steps,
#: sweeps), longest first. They start first, so no minute-long run is left for the end. The workers
#: share the rest by stealing (``--dist worksteal`` in pyproject.toml): each starts on half of the tests
#: in this order, and one that runs out takes half of what the other has still to run, so the two end
#: together. (``--dist load`` gave one worker its first chunk of 178 tests, these modules among them,
#: and nothing could move off it: the other idled for the last 200 s.) A stale entry costs only balance.
LONGEST_FIRST = (
    "test_job_scale",
    "test_sweep",
    "test_integrity_run",
    "test_serving_run",
    "test_replica_elastic",
    "test_head_loss",
    "test_preemption_schedules",
    "test_doc_examples",
    "test_drill",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the :data:`LONGEST_FIRST` modules first, in that order; each module keeps its tests' order
    (its module-scoped fixtures are set up once)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))
