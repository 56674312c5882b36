"""The MLP workload learns, and each checkpoint component is what a bit-for-bit resume needs."""

from __future__ import annotations

import numpy as np
import pytest

from testbed.topology.layout import Layout
from workloads import COMPONENTS
from workloads.mlp import MLPRegression, lr_at

OPTIONS = {"steps": 40}


def train(w: MLPRegression, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        loss, grads, _ = w.local_step()
        w.apply(None, grads)
        losses.append(loss)
    return losses


def test_loss_falls() -> None:
    losses = train(MLPRegression(OPTIONS, seed=3, rank=0, layout=Layout(dp=1)), 40)
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:5])


def test_schedule_warms_up_then_decays_to_min() -> None:
    opts = {"lr": 1e-2, "min_lr": 1e-3, "warmup": 4}
    assert [lr_at(p, 20, opts) for p in range(4)] == pytest.approx([2.5e-3, 5e-3, 7.5e-3, 1e-2])
    assert lr_at(20, 20, opts) == pytest.approx(1e-3)
    assert lr_at(10, 20, opts) < lr_at(6, 20, opts)


def resume_digest(drop: str | None) -> tuple[str, str]:
    """(digest of an uninterrupted run at step 20, digest of one resumed at step 10 without ``drop``)."""
    ref = MLPRegression(OPTIONS, seed=5, rank=1, layout=Layout(dp=2))
    train(ref, 10)
    saved = {c: ref.state(c) for c in COMPONENTS if c != drop}
    train(ref, 10)
    resumed = MLPRegression(OPTIONS, seed=5, rank=1, layout=Layout(dp=2))
    for comp, arrays in saved.items():
        resumed.load(comp, arrays)
    train(resumed, 10)
    return ref.params_digest(), resumed.params_digest()


def test_complete_state_resumes_bit_for_bit() -> None:
    ref, resumed = resume_digest(drop=None)
    assert ref == resumed


@pytest.mark.parametrize("component", COMPONENTS)
def test_dropping_any_component_changes_the_trajectory(component: str) -> None:
    ref, resumed = resume_digest(drop=component)
    assert ref != resumed, f"{component} is declared checkpointable but resuming without it changes nothing"


def test_ranks_draw_different_data_and_dropout() -> None:
    a, b = MLPRegression(OPTIONS, 5, 0, Layout(dp=2)), MLPRegression(OPTIONS, 5, 1, Layout(dp=2))
    assert not np.array_equal(a.state("rng")["pcg64"], b.state("rng")["pcg64"])
    assert set(a.shard.tolist()).isdisjoint(b.shard.tolist())
