"""A package outside the testbed adds a fault kind, a recovery strategy, a check and a workload
through the testbed's entry-point groups, and one scenario uses all four.

``tests/plugin`` is that package. It is installed here as a user would (pip, from its source, into
a folder of its own put on ``PYTHONPATH``), and the testbed's code is not touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parent / "plugin"
TESTBED = Path(sys.executable).with_name("testbed")


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a shell in which the plugin package is installed."""
    source = tmp_path_factory.mktemp("plugin-source") / "plugin"
    shutil.copytree(PLUGIN, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    site = tmp_path_factory.mktemp("site-packages")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    done = subprocess.run(
        [*pip, "--target", str(site), str(source)], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    return {**os.environ, "PYTHONPATH": str(site)}


def _testbed(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TESTBED), *args], capture_output=True, text=True, timeout=timeout, env=env or dict(os.environ)
    )


def test_without_the_plugin_its_names_are_refused() -> None:
    done = _testbed("validate", str(PLUGIN / "scenario.yaml"))
    assert done.returncode == 254
    assert "'linear'" in done.stderr  # the workload is the first thing it cannot find


def test_the_plugin_adds_one_of_each(plugin_env: dict[str, str]) -> None:
    listed = _testbed("list", env=plugin_env)
    assert listed.returncode == 0, listed.stderr
    listing: dict[str, set[str]] = {}
    for line in listed.stdout.splitlines():
        if not line.startswith(" "):
            section = listing.setdefault(line.split(" (")[0].rstrip(":"), set())
        else:
            section.add(line.split()[0])
    assert "thermal_throttle" in listing["fault kinds"] and "node_kill" in listing["fault kinds"]
    assert "noted_restart" in listing["recovery strategies"] and "restart" in listing["recovery strategies"]
    assert "loss_fell" in listing["checks"] and "recovered" in listing["checks"]
    assert "linear" in listing["workloads"] and "mlp" in listing["workloads"]
    valid = _testbed("validate", str(PLUGIN / "scenario.yaml"), env=plugin_env)
    assert valid.returncode == 0, valid.stderr
    assert "linear dp4" in valid.stdout and "2 fault(s)" in valid.stdout


@pytest.mark.slow
def test_a_scenario_runs_with_all_four(plugin_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = _testbed("run", str(PLUGIN / "scenario.yaml"), "--out", str(out), env=plugin_env, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "report.json").read_text())
    events = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    checks = {c["name"]: c["status"] for c in report["checks"]}
    # the check: it ran in the report beside the testbed's own, and passed
    assert checks["loss_fell"] == "pass" and checks["matches_uninterrupted"] == "pass"
    # the workload: it trained (the loss fell) under its own name
    assert next(e for e in events if e["event"] == "workload")["name"] == "linear"
    # the fault kind: it fired, and slowed its rank enough for the hotspot diagnosis to name it
    fired = [e for e in events if e["event"] == "fault_injected"]
    assert [f["kind"] for f in fired] == ["thermal_throttle", "node_kill"]
    assert report["hotspot"]["verdict"] == "straggler" and "rank 1" in report["hotspot"]["message"]
    # the strategy: its own cure ran (the plugin's journal event), then it went back by restart
    notes = [e for e in events if e["event"] == "plugin_note"]
    assert len(notes) == 1 and 2 in notes[0]["failed_ranks"] and notes[0]["step"] == 7
    assert len(report["recoveries"]) == 1 and report["recoveries"][0]["resume_step"] == 5
