"""The benchmark writes the peers' result format, with checked results (a smoke run, not a timing)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from testbed.experiments import bench, stepbench
from workloads.blockspec import full_shapes, options_of

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


TINY = """\
version: 1
name: tiny
cluster: {preset: atlas-900-a3, supernodes: 1, npus_per_supernode: 4}
workload: {name: transformer, steps: 2, parallel: {dp: 1, tp: 2, pp: 2}, d_model: 16, ffn: 32}
"""


def test_stepbench_times_steps_and_applies_option_overrides(tmp_path: Path) -> None:
    scenario, out = tmp_path / "tiny.yaml", tmp_path / "steps.json"
    scenario.write_text(TINY)
    assert (
        stepbench.main(
            [str(scenario), "--steps", "4", "--warmup", "1", "--option", "micro_batches=4", "--out", str(out)]
        )
        == 0
    )
    (result,) = json.loads(out.read_text())
    assert result["layout"] == "dp1 x tp2 x pp2 x ep1" and result["world"] == 4
    assert result["options"]["micro_batches"] == 4 and result["steps"] == 4
    assert (
        result["steps_per_s"] > 0
        and result["step_ms"]["q1"] <= result["step_ms"]["median"] <= result["step_ms"]["q3"]
    )
    assert result["parameters"] == sum(
        math.prod(s) for s in full_shapes(options_of({"d_model": 16, "ffn": 32})).values()
    )


def test_stepbench_refuses_a_malformed_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        stepbench.main(["x.yaml", "--option", "micro_batches"])
    assert info.value.code == 2 and "KEY=NUMBER" in capsys.readouterr().err
