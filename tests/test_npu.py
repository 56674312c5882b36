"""The NPU program without Ray (ranks as threads): group set-up, link-setup timeouts, training."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest

from testbed.collectives import HCCL_CONNECT_GRACE_S
from testbed.core.errors import LinkSetupTimeout
from testbed.topology.presets import PRESETS, LinkSetupModel, Topology
from testbed.train.npu import NPU
from testbed.train.rank_spec import RankSpec
from workloads import WORKLOADS


def spec_with_setup(base_s: float, connect_s: float = 120.0, world: int = 2) -> RankSpec:
    preset = dataclasses.replace(PRESETS["atlas-900-a3"], link_setup=LinkSetupModel(base_s, 0.0, 0.0))
    return RankSpec(
        Topology(preset, 1, world),
        seed=1,
        workload_factory=WORKLOADS["mlp"].factory,
        workload_options={"steps": 4},
        connect_timeout_s=connect_s,
        exec_timeout_s=1836.0,
        guard_s=10.0,
    )


def on_all(npus: list[NPU], method: str, *args: Any) -> list[Any]:
    out: list[Any] = [None] * len(npus)

    def call(i: int) -> None:
        try:
            out[i] = getattr(npus[i], method)(*args)
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(npus))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return out


def group(spec: RankSpec) -> tuple[list[NPU], dict[int, list[Any]]]:
    npus = [NPU(r, spec) for r in range(spec.topology.world)]
    return npus, {r: list(n.dataplane.address) for r, n in enumerate(npus)}


def test_group_is_ready_after_its_slowest_link() -> None:
    npus, addrs = group(spec_with_setup(base_s=7.0))
    try:
        results = on_all(npus, "open_group", 0, addrs, 100.0)
        assert [r["t"] for r in results] == [pytest.approx(107.0)] * 2
        steps = on_all(npus, "train_step", 1)
        assert steps[0]["digest"] == steps[1]["digest"]
        assert steps[0]["t"] > 107.0
    finally:
        on_all(npus, "close")


def test_link_setup_past_connect_timeout_plus_grace_fails_naming_the_pair() -> None:
    npus, addrs = group(spec_with_setup(base_s=150.0, connect_s=120.0))
    try:
        results = on_all(npus, "open_group", 0, addrs, 10.0)
        for err in results:
            assert isinstance(err, LinkSetupTimeout)
            assert err.t == pytest.approx(10.0 + 120.0 + HCCL_CONNECT_GRACE_S)  # type: ignore[attr-defined]
            assert "0->1" in str(err) or "1->0" in str(err)
            assert "connect_s" in str(err)
    finally:
        on_all(npus, "close")


def test_setup_inside_the_grace_window_still_succeeds() -> None:
    npus, addrs = group(spec_with_setup(base_s=135.0, connect_s=120.0))
    try:
        results = on_all(npus, "open_group", 0, addrs, 0.0)
        assert all(isinstance(r, dict) and r["t"] == pytest.approx(135.0) for r in results)
    finally:
        on_all(npus, "close")


def test_a_spare_takes_its_rank_only_once_its_data_plane_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    """The supernode's line thread hands a rank >= 0 the markers of the death the spare replaces
    (``mark_dead``, relayed aborts) while the spare is still adopting: its data plane must be there."""
    import testbed.train.npu as npu_module

    seen: list[int] = []
    real = npu_module.DataPlane

    def watching(*args: Any, **kw: Any) -> Any:
        seen.append(spare.rank)  # what the line thread would see while the data plane is being made
        return real(*args, **kw)

    spare = NPU(None, spec_with_setup(0.0))
    monkeypatch.setattr(npu_module, "DataPlane", watching)
    try:
        spare.adopt(1)
        assert seen == [-1] and spare.rank == 1
        spare.mark_dead(0)  # the marker the line thread delivers: it finds the data plane
    finally:
        spare.close()
