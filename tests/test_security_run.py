"""A stranger during a real run: every TCP and unix listener of the run's processes, found from the
processes themselves, gets a pickled payload and a forged frame. Nothing runs, nothing is delivered,
each refusal is journalled, and the run's journal is the one an unattacked run writes. And a driver
killed with SIGKILL leaves no socket folder and no process behind."""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest

from testbed.actors.rank_signals import process_gone
from testbed.actors.session import RaySession
from testbed.control.runner import run
from testbed.core.journal import deterministic_view, read_journal
from testbed.scenario.parse import parse_scenario
from tests.conftest import ROOT, SCENARIOS
from tests.test_security import attacks, stranger

SCENARIO = """\
version: 1
name: stranger
seed: 11
cluster: {preset: atlas-900-a3, supernodes: 2, npus_per_supernode: 2}
workload: {name: mlp, steps: 16, parallel: {dp: 4}, hidden: 16, layers: 2}
policy:
  checkpoint: {every: 4}
  recovery: {strategy: restart, restart_s: 30}
faults:
  - {kind: node_kill, target: {rank: 3}, at: {step: 11, during: allreduce}}
expect: {recovered: true, checkpoint_complete: true, matches_uninterrupted: true}
"""


def run_processes(session: RaySession) -> dict[int, str]:
    """The run's own processes, found from the process table under this session's Ray: supernode
    actors, NPU hosts and NPU processes (pid -> what it is). Ray's daemons are not among them, nor
    the idle supernodes an earlier run left for the next (their NPU hosts have no NPU)."""
    found: dict[int, str] = {}
    for root in session.owned_pids():
        try:
            family = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for proc in family:
            try:
                if not " ".join(proc.cmdline()).startswith("ray::Supernode"):
                    continue
                hosts = [h for h in proc.children() if "testbed.actors.npu_host" in " ".join(h.cmdline())]
                npus = [n.pid for h in hosts for n in h.children()]
            except psutil.Error:
                continue
            if npus:
                found.update({proc.pid: "supernode", **{h.pid: "host" for h in hosts}})
                found.update(dict.fromkeys(npus, "npu"))
    return found


def listeners(pids: dict[int, str]) -> list[tuple[int, Any]]:
    """Every listening TCP address and named unix socket of ``pids``: (pid, address)."""
    out: list[tuple[int, Any]] = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            tcp = {c.laddr for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
            unix = {c.laddr for c in proc.net_connections("unix") if c.laddr}
        except psutil.Error:
            continue
        out += [(pid, (a.ip, a.port)) for a in tcp] + [(pid, path) for path in unix]
    return out


def _view(journal: Path) -> list[dict[str, Any]]:
    events = [e for e in read_journal(journal) if e["event"] != "peer_refused"]
    return [{k: v for k, v in e.items() if k != "seq"} for e in deterministic_view(events)]


@pytest.mark.ray
@pytest.mark.slow
def test_a_stranger_on_every_listener_of_a_run_runs_nothing_and_changes_nothing(
    ray_session: RaySession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = parse_scenario(SCENARIO)
    out = tmp_path / "run"
    clean = run(scenario, out)
    assert clean.verdict == "pass"
    clean_view = _view(out / "journal.jsonl")
    shutil.rmtree(out)

    key = secrets.token_bytes(32)  # the run's secret, known to the test only to look for it
    monkeypatch.setattr("testbed.core.secret.secrets.token_bytes", lambda n: key)
    marker = tmp_path / "ran"
    struck: dict[Any, tuple[int, str, list[bytes]]] = {}

    def strike(event: dict[str, Any]) -> None:
        if event["event"] != "step_end" or event.get("step") != 5 or struck:
            return
        pids = run_processes(ray_session)
        assert sorted(pids.values()).count("npu") == 4 and list(pids.values()).count("supernode") == 2
        targets = listeners(pids)
        with ThreadPoolExecutor(16) as pool:
            heard = {
                addr: list(pool.map(lambda d, a=addr: stranger(a, d, wait_s=2.0), attacks(marker)))
                for _, addr in targets
            }
        struck.update({addr: (pid, pids[pid], heard[addr]) for pid, addr in targets})

    attacked = run(scenario, out, listener=strike)
    assert struck, "the run ended before the stranger came"
    assert not marker.exists(), "a listener unpickled the stranger's payload"
    assert attacked.verdict == "pass"
    assert "security: " in attacked.summary() and "connection(s) refused" in attacked.summary()
    assert _view(out / "journal.jsonl") == clean_view  # the same run, event for event, parameters too

    refused = [e for e in read_journal(out / "journal.jsonl") if e["event"] == "peer_refused"]
    relay_lines = set()
    for addr, (pid, what, heard) in struck.items():
        named = f"unix socket {addr}" if isinstance(addr, str) else f"tcp {addr[0]}:{addr[1]}"
        hits = [e for e in refused if named in e["listener"]]
        if what == "npu":  # every listener of an NPU process is the testbed's data plane
            assert heard == [b""] * 3 and len(hits) == 3, (addr, heard, hits)  # closed, not a byte said
            assert all("no proof of the run's secret" in e["reason"] for e in hits)
        elif hits:  # a supernode's relay lines (its other ports are Ray's own)
            assert heard == [b""] * 3 and len(hits) == 3 and all("relay lines" in e["listener"] for e in hits)
            relay_lines.add(pid)
    assert len(relay_lines) == 2, "each supernode's relay lines were found, and refused the stranger"
    npu_unix = [a for a, (_, what, _) in struck.items() if what == "npu" and isinstance(a, str)]
    assert len(npu_unix) == 4 and len(struck) - len(npu_unix) >= 6
    assert len(refused) == 3 * (len(npu_unix) + 4 + 2)  # each NPU's two listeners, each relay line

    written = b"".join(p.read_bytes() for p in out.rglob("*") if p.is_file())
    for form in (key, key.hex().encode(), base64.b64encode(key), repr(key).encode()):
        assert form not in written, "the run's secret was written to the run's folder"


@pytest.mark.slow
def test_a_driver_killed_with_sigkill_leaves_no_socket_folder_and_no_process(tmp_path: Path) -> None:
    journal = tmp_path / "run" / "journal.jsonl"
    command = [sys.executable, "-m", "testbed.cli", "run", str(SCENARIOS / "quickstart.yaml")]
    proc = subprocess.Popen(
        [*command, "--out", str(tmp_path / "run")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    seen: set[int] = set()
    folders: set[str] = set()
    deadline = time.monotonic() + 120
    try:
        driver = psutil.Process(proc.pid)
        while time.monotonic() < deadline and proc.poll() is None:
            family = driver.children(recursive=True)
            seen |= {p.pid for p in family}
            for p in family:
                try:
                    folders |= {os.path.dirname(os.path.dirname(c.laddr)) for c in p.net_connections("unix")}
                except psutil.Error:
                    continue
            folders = {f for f in folders if os.path.basename(f).startswith("tb-sock-")}
            if folders and journal.exists() and '"step_end"' in journal.read_text():
                break
            time.sleep(0.1)
        assert proc.poll() is None and folders, "the run ended before it could be killed"
        for folder in folders:  # the run's socket folder and each supernode's: only this user enters
            assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
            assert all(stat.S_IMODE(os.stat(p).st_mode) == 0o700 for p in Path(folder).iterdir())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (
        any(os.path.exists(f) for f in folders) or not all(process_gone(p) for p in seen)
    ):
        time.sleep(0.2)
    assert [f for f in folders if os.path.exists(f)] == []
    left = [p for p in seen if not process_gone(p)]
    assert left == [], f"processes outlived the killed driver: {left}"
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    assert lines[0]["event"] == "run_start"  # the journal up to the kill is on disk
