"""Ray's head lost: the run stops within seconds (not when Ray's own clients give up on the GCS), says
what happened and how to go on, keeps every committed checkpoint, and ``testbed resume`` finishes it
on another Ray, bit for bit."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from testbed.actors.head_watch import HeadWatch
from testbed.core.errors import HeadLost
from tests.conftest import ROOT


def _wait_lost(watch: HeadWatch, bound_s: float = 10.0) -> None:
    deadline = time.monotonic() + bound_s
    while watch.lost is None and time.monotonic() < deadline:
        time.sleep(0.02)


def test_the_watch_finds_a_head_lost_only_once_its_port_refuses_several_knocks_in_a_row() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    watch = HeadWatch(f"127.0.0.1:{port}", period_s=0.05, misses=3)
    watch.start()
    try:
        time.sleep(0.5)  # ten knocks on a live port
        assert watch.lost is None
        watch.check()  # nothing to raise
        listener.close()
        _wait_lost(watch)
        assert watch.lost is not None and watch.lost["address"] == f"127.0.0.1:{port}"
        with pytest.raises(HeadLost) as err:
            watch.check()
        assert f"Ray's head at 127.0.0.1:{port} is lost" in str(err.value)
        assert "refused 3 connections in a row" in str(err.value)
    finally:
        watch.stop()
        listener.close()


SCENARIO = """\
version: 1
name: ray-head-loss
seed: 5
cluster: {preset: atlas-800t-a2, supernodes: 2, npus_per_supernode: 2}
workload: {name: mlp, steps: 300, parallel: {dp: 4}, hidden: 32}
policy:
  checkpoint: {every: 5}
expect: {recovered: true, checkpoint_complete: true, matches_uninterrupted: true}
"""

# A head without CPUs and a worker node per supernode. The head's GCS is killed once the journal holds
# step 6; Ray's own clients would give up on it after 120 s here, so a run that stops sooner stopped
# on its own. Then a new Ray cluster, and the resume.
DRIVER = """\
import json, os, sys, threading, time
from pathlib import Path
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_gcs_rpc_server_reconnect_timeout_s"] = "120"
import testbed

testbed.keep_ray_on_loopback()  # before ray is imported
import ray
from ray.cluster_utils import Cluster
from testbed.train.checkpoint import verify

out, text = Path(sys.argv[1]), Path(sys.argv[2]).read_text()
head = {"node_ip_address": "127.0.0.1", "object_store_memory": 80 * 2**20}


def cluster_of(n):
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, **head})
    for i in range(n):
        c.add_node(num_cpus=1, **{**head, "node_ip_address": f"127.0.0.{i + 2}"})
    c.wait_for_nodes()
    return c


def step_done(step):
    path = out / "journal.jsonl"
    lines = path.read_text().splitlines()[:-1] if path.exists() else []
    return any('"step_end"' in line and json.loads(line).get("step") == step for line in lines)


def kill_head(c, killed):
    deadline = time.monotonic() + 120
    while not step_done(6) and time.monotonic() < deadline:
        time.sleep(0.01)
    c.head_node.kill_gcs_server()
    killed["at"] = time.monotonic()


scenario = testbed.parse_scenario(text, "head_loss.yaml")
first, killed = cluster_of(2), {}
threading.Thread(target=kill_head, args=(first, killed), daemon=True).start()
lost = testbed.run(scenario, out, address=first.address)
stop_s = time.monotonic() - killed["at"]
first.shutdown()
events = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
kept = [e["path"] for e in events if e["event"] == "checkpoint_committed"]
pruned = {s for e in events if e["event"] == "checkpoint_pruned" for s in e["steps"]}
verified = [Path(p).name for p in kept if verify(Path(p))]
second = cluster_of(2)
try:
    resumed = testbed.resume(out, scenario, address=second.address)
    try:
        testbed.resume(out, scenario, address=second.address)
        again = "resumed twice"
    except testbed.TestbedError as exc:
        again = str(exc)
finally:
    ray.shutdown()
    second.shutdown()
print(json.dumps({"lost": [lost.verdict, lost.exit_code, lost.data["error"]], "stop_s": stop_s,
                  "committed": len(kept), "pruned": len(pruned), "verified": verified,
                  "resumed": [resumed.verdict, resumed.exit_code], "again": again}))
"""


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_lost_ray_head_stops_the_run_fast_keeps_its_checkpoints_and_it_resumes_on_a_new_head(
    tmp_path: Path,
) -> None:
    (tmp_path / "scenario.yaml").write_text(SCENARIO)
    (tmp_path / "driver.py").write_text(textwrap.dedent(DRIVER))
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "run"), str(tmp_path / "scenario.yaml")],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcome = json.loads(proc.stdout.strip().splitlines()[-1])
    verdict, code, error = outcome["lost"]
    assert (verdict, code) == ("head_lost", 3), error
    assert "Ray's head at 127.0.0.1:" in error and "is lost" in error
    assert "testbed resume " + str(tmp_path / "run") in error and "--address" in error
    assert outcome["stop_s"] < 60.0, outcome  # before Ray's own clients would have given up on it
    # every checkpoint it committed and did not prune by retention is on disk and verifies
    assert outcome["committed"] >= 1 and len(outcome["verified"]) == outcome["committed"] - outcome["pruned"]
    assert (outcome["resumed"]) == ["pass", 0], outcome
    assert "this run ended" in outcome["again"]
    events = [json.loads(line) for line in (tmp_path / "run" / "journal.jsonl").read_text().splitlines()]
    names = [e["event"] for e in events]
    (lost,) = [e for e in events if e["event"] == "ray_head_lost"]
    assert names.count("run_end") == 1 and names.count("run_error") == 0  # the lost ending was cut
    before = events[: names.index("ray_head_lost")]
    newest = max(e["step"] for e in before if e["event"] == "checkpoint_committed")
    (resumed,) = [e for e in events if e["event"] == "resume" and e.get("phase") == "main"]
    assert resumed["from_step"] == newest  # from the newest committed checkpoint: none was lost
    (failure,) = [e for e in events if e["event"] == "failure_detected"]
    assert failure["detected_by"] == "ray_head" and failure["t"] == lost["t"]
