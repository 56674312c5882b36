"""The benchmark writes the peers' result format, with checked results (a smoke run, not a timing)."""

from __future__ import annotations

import pytest

from testbed import bench

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]


def test_bench_result_has_the_peers_format(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PB_SIZES", "4096,65536")
    monkeypatch.setenv("PB_ITER_SCALE", "0.05")
    result = bench.run(n=2, algo="ring", label="smoke", warmup=1)
    assert result["n"] == 2 and result["label"] == "smoke"
    for mode in ("sizes_in_actor", "sizes_driver"):
        assert set(result[mode]) == {"4096", "65536"}
        for entry in result[mode].values():
            assert entry["ok"] is True
            assert len(entry["times_s"]) == entry["iters"] >= 2
            assert entry["median_s"] > 0
    assert result["algorithms"] == {"4096": "allreduce:ring", "65536": "allreduce:ring"}
    assert len(result["pss_ready_mib"]) == 2 and result["startup_s"] > 0
