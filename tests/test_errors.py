"""Every error pickles (errors cross actor boundaries) and keeps its fields and message."""

from __future__ import annotations

import pickle

import pytest

from testbed.core import errors

KINDS = [
    errors.TestbedError,
    errors.HarnessHang,
    errors.LinkSetupTimeout,
    errors.CollectiveTimeout,
    errors.PeerLost,
    errors.CheckpointError,
    errors.RecoveryFailed,
]


@pytest.mark.parametrize("cls", KINDS)
def test_error_round_trips_through_pickle(cls: type[errors.TestbedError]) -> None:
    err = cls("rank 3: something named, with a fix", rank=3, peer=5, wait_start=1.5)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert str(back) == "rank 3: something named, with a fix"
    assert (back.rank, back.peer, back.wait_start) == (3, 5, 1.5)  # type: ignore[attr-defined]
    assert isinstance(back, errors.TestbedError)


def test_scenario_error_keeps_every_problem() -> None:
    err = errors.ScenarioError("2 problems", problems=["a:1: x", "a:2: y"])
    back = pickle.loads(pickle.dumps(err))
    assert back.problems == ["a:1: x", "a:2: y"]  # type: ignore[attr-defined]
