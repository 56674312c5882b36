"""The ``testbed`` command as a user runs it: exit codes, clear errors, nothing left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from testbed.actors.rank_signals import process_gone
from tests.conftest import ROOT, SCENARIOS

CHECK_NO_RAY = (
    "import sys; from testbed.cli import main; code = main(sys.argv[1:]); "
    "print('RAY_IMPORTED' if 'ray' in sys.modules else 'NO_RAY'); sys.exit(code)"
)
GOOD = (SCENARIOS / "quickstart.yaml").read_text()


def cli_in_process(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHECK_NO_RAY, *args], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


@pytest.mark.parametrize(
    ("mutation", "needle"),
    [
        (lambda t: t.replace("  recovery: {", "  recovery: {{"), "not valid YAML"),
        (lambda t: t.replace("kind: node_kill", "kind: node_kil"), "Did you mean 'node_kill'"),
        (lambda t: t.replace("rank: 5", "rank: 8"), "rank 8 is outside the cluster"),
        (lambda t: t.replace("dp: 8", "dp: 6"), "does not fit the cluster's 8 NPUs"),
    ],
    ids=["malformed-yaml", "unknown-kind", "rank-outside", "layout-misfit"],
)
@pytest.mark.parametrize("command", ["run", "validate"])
def test_bad_input_exits_254_before_any_actor_starts(
    tmp_path: Path, mutation, needle: str, command: str
) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.yaml"
    bad.write_text(mutation(GOOD))
    proc = (
        cli_in_process(command, str(bad), "--out", str(tmp_path / "out"))
        if command == "run"
        else cli_in_process(command, str(bad))
    )
    assert proc.returncode == 254, proc.stderr
    assert needle in proc.stderr
    assert f"{bad}:" in proc.stderr  # names the file (and line)
    assert "Traceback" not in proc.stderr
    assert "NO_RAY" in proc.stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args", [["run"], ["run", "x.yaml", "--seed", "abc"], ["frobnicate"], ["run", "missing.yaml"]]
)
def test_bad_arguments_exit_254(args: list[str]) -> None:
    proc = cli_in_process(*args)
    assert proc.returncode == 254
    assert "Traceback" not in proc.stderr and proc.stderr.strip()


@pytest.mark.parametrize("command", ["run", "plan", "compare", "tune"])
def test_every_command_refuses_a_negative_seed(command: str) -> None:
    proc = cli_in_process(command, str(SCENARIOS / "quickstart.yaml"), "--seed", "-1")
    assert proc.returncode == 254
    assert "--seed -1: a seed is a non-negative integer" in proc.stderr and "Traceback" not in proc.stderr


def test_sweep_refuses_a_negative_seed_before_it_makes_its_folder(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    proc = cli_in_process(
        "sweep", str(SCENARIOS / "quickstart.yaml"), "--values", "10", "--seed", "-1", "--out", str(out)
    )
    assert proc.returncode == 254 and "--seed -1: a seed is a non-negative integer" in proc.stderr
    assert not out.exists()


def test_validate_accepts_the_library() -> None:
    paths = sorted(SCENARIOS.glob("*.yaml"))
    proc = cli_in_process("validate", *map(str, paths))
    assert proc.returncode == 0, proc.stderr
    assert [line.split(":")[0] for line in proc.stdout.splitlines() if ": valid (" in line] == list(
        map(str, paths)
    )


def test_validate_takes_several_files_and_names_every_problem_of_every_invalid_one(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("rank: 5", "rank: 8").replace("dp: 8", "dp: 6"))
    worse = tmp_path / "worse.yaml"
    worse.write_text("version: 2\n")
    proc = cli_in_process("validate", str(SCENARIOS / "quickstart.yaml"), str(bad), str(worse))
    assert proc.returncode == 254
    assert "quickstart.yaml: valid (" in proc.stdout
    rank_line, dp_line = (
        next(i for i, x in enumerate(GOOD.splitlines(), 1) if k in x) for k in ("rank: 5", "dp: 8")
    )
    assert f"{bad}:{rank_line}" in proc.stderr and f"{bad}:{dp_line}" in proc.stderr
    assert f"{worse}:1" in proc.stderr
    assert "Traceback" not in proc.stderr


def _watch(proc: subprocess.Popen[str], until: float, stop_when: Path | None = None) -> set[int]:
    """Every descendant of ``proc`` seen while it runs (Ray daemons and workers included)."""
    seen: set[int] = set()
    parent = psutil.Process(proc.pid)
    while proc.poll() is None and time.monotonic() < until:
        try:
            seen |= {p.pid for p in parent.children(recursive=True)}
        except psutil.NoSuchProcess:
            break
        if stop_when is not None and stop_when.exists() and "cluster_started" in stop_when.read_text():
            return seen
        time.sleep(0.1)
    return seen


def _assert_all_gone(pids: set[int]) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not all(process_gone(p) for p in pids):
        time.sleep(0.2)
    left = [p for p in pids if not process_gone(p)]
    assert left == [], f"processes outlived the run: {[psutil.Process(p).cmdline()[:2] for p in left]}"


def start_quickstart(tmp_path: Path) -> subprocess.Popen[str]:
    """``testbed run scenarios/quickstart.yaml`` as a user runs it, with its own Ray."""
    command = [sys.executable, "-m", "testbed.cli", "run", str(SCENARIOS / "quickstart.yaml")]
    return subprocess.Popen(
        [*command, "--out", str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )


@pytest.mark.slow
def test_quickstart_command_passes_and_leaves_no_ray_process(tmp_path: Path) -> None:
    proc = start_quickstart(tmp_path)
    seen = _watch(proc, until=time.monotonic() + 240)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, out + err
    assert "verdict: PASS" in out and "seed: 1234" in out and "replay: testbed run" in out
    # the terminal holds the testbed's lines only; Ray's go to the run's log
    assert "raylet" not in out + err and "worker died" not in out + err
    assert all(line.startswith(("testbed:", "verdict:")) for line in out.splitlines()[:2]) and not err.strip()
    assert (tmp_path / "run" / "ray.log").is_file()
    assert len(seen) >= 10, "expected Ray daemons and ten actor processes"
    _assert_all_gone(seen)
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["verdict"] == "pass"


@pytest.mark.slow
def test_ctrl_c_leaves_a_journal_a_report_and_no_ray_process(tmp_path: Path) -> None:
    journal = tmp_path / "run" / "journal.jsonl"
    proc = start_quickstart(tmp_path)
    seen = _watch(proc, until=time.monotonic() + 120, stop_when=journal)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert "interrupted" in out
    _assert_all_gone(seen)
    events = [json.loads(line) for line in journal.read_text().splitlines()]
    assert any(e["event"] == "run_error" and e["outcome"] == "interrupted" for e in events)
    assert json.loads((tmp_path / "run" / "report.json").read_text())["verdict"] == "interrupted"


SMALL = """\
version: 1
name: small-remote
seed: 5
cluster: {preset: atlas-800t-a2, supernodes: 1, npus_per_supernode: 2}
workload: {name: mlp, steps: 8, parallel: {dp: 2}, hidden: 16}
policy: {checkpoint: {every: 4}}
faults: [{kind: node_kill, target: {rank: 1}, at: {step: 6, during: allreduce}}]
"""


@pytest.mark.ray
def test_run_on_an_existing_cluster_keeps_that_cluster(ray_session: object, tmp_path: Path) -> None:
    import ray

    scenario = tmp_path / "small.yaml"
    scenario.write_text(SMALL)
    address = ray.get_runtime_context().gcs_address
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "testbed.cli",
            "run",
            str(scenario),
            "--address",
            address,
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = [json.loads(line) for line in (tmp_path / "run" / "journal.jsonl").read_text().splitlines()]
    started = next(e for e in events if e["event"] == "cluster_started")
    assert started["ray_started"] is False
    assert ray.get(ray.put("still here"), timeout=30) == "still here"


RAY_FIRST = """
import ray._private.services as services
from testbed.core.errors import TestbedError
from testbed.actors.session import RaySession
if services.node_ip_address_from_perspective().startswith("127."):
    print("SKIP no external address on this machine")
else:
    try:
        with RaySession():
            print("STARTED")
    except TestbedError as exc:
        print("REFUSED", exc)
"""


@pytest.mark.slow
def test_ray_imported_before_testbed_is_refused_with_the_fix() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    proc = subprocess.run(
        [sys.executable, "-c", RAY_FIRST], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT
    )
    if proc.stdout.startswith("SKIP"):
        pytest.skip(proc.stdout.strip())
    assert proc.stdout.startswith("REFUSED"), proc.stdout + proc.stderr
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0" in proc.stdout and "keep_ray_on_loopback()" in proc.stdout


def test_validate_warns_of_a_tp_group_across_supernodes(tmp_path: Path) -> None:
    path = tmp_path / "tp.yaml"
    path.write_text(
        "version: 1\nname: tp\ncluster: {supernodes: 2, npus_per_supernode: 2}\n"
        "workload: {name: transformer, steps: 2, parallel: {tp: 4}}\n"
    )
    proc = cli_in_process("validate", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "transformer dp1 x tp4 x pp1 x ep1" in proc.stdout
    assert "warning: TP group [0, 1, 2, 3] spans supernodes [0, 1]" in proc.stdout


def test_compare_refuses_an_unknown_strategy_with_254(tmp_path: Path) -> None:
    proc = cli_in_process("compare", str(SCENARIOS / "quickstart.yaml"), "--strategies", "restart,reboot")
    assert (
        proc.returncode == 254 and "unknown strategy reboot" in proc.stderr and "Traceback" not in proc.stderr
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--values", "4", "--field", "policy.checkpoint.evry"], "did you mean 'every'"),
        (["--values", "-3"], "policy.checkpoint.every: -3 is out of range"),
        (["--values", "4", "--mtbf", "soon"], "--mtbf 'soon' is not a positive duration"),
        (["--values", "4", "--field", "seed.x"], "'seed' in"),
    ],
    ids=["unknown-field", "out-of-range", "bad-mtbf", "not-a-mapping"],
)
def test_sweep_refuses_bad_arguments_with_254_before_starting_anything(args: list[str], needle: str) -> None:
    proc = cli_in_process("sweep", str(SCENARIOS / "checkpoint_sweep.yaml"), *args)
    assert proc.returncode == 254, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr


def test_hotspot_reads_a_run_s_journal_and_names_the_culprit(tmp_path: Path) -> None:
    from tests.test_hotspot import ring_journal

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lines = [json.dumps(e) for e in ring_journal(slow_rank=3)]
    (run_dir / "journal.jsonl").write_text("\n".join(lines) + "\n")
    proc = cli_in_process("hotspot", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("straggler: rank 3 is a straggler") and "'3': 2.0" in proc.stdout
    missing = cli_in_process("hotspot", str(tmp_path / "nothing"))
    assert missing.returncode == 254 and "no journal there" in missing.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [(["--connect", "60"], "HCCL accepts 120 to 7200 s"), (["--exec", "abc"], "give positive durations")],
    ids=["connect-out-of-range", "exec-not-a-duration"],
)
def test_tune_refuses_bad_candidates_with_254_before_starting_anything(args: list[str], needle: str) -> None:
    proc = cli_in_process("tune", str(SCENARIOS / "timeout_tuning.yaml"), *args)
    assert proc.returncode == 254, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr
