"""On a Ray cluster of several nodes (started locally with Ray's own test utilities, each node on an
address of its own: 127.0.0.2, 127.0.0.3, ...), each supernode runs on a node of its own, its NPUs
listen on that node's address, a supernode loss can be a real Ray node loss, and checkpoint storage
that the nodes do not share is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCENARIO = """\
version: 1
name: ray-node-loss
seed: 21
cluster: {preset: atlas-800t-a2, supernodes: 2, npus_per_supernode: 2}
workload: {name: mlp, steps: 12, parallel: {dp: 4}, hidden: 32}
policy:
  checkpoint: {every: 5}
faults:
  - {kind: node_kill, target: {supernode: 1}, scope: ray_node, at: {step: 8}}
expect: {recovered: true, checkpoint_complete: true, matches_uninterrupted: true}
"""

# A head without CPUs holds no supernode (losing it would end the run); three worker nodes: one per
# supernode and a spare that takes the lost supernode's bundle. Fast health checks so that Ray
# declares the killed node dead in about a second.
DRIVER = """\
import json, os, sys
from pathlib import Path
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_health_check_period_ms"] = "300"
os.environ["RAY_health_check_failure_threshold"] = "3"
import testbed

testbed.keep_ray_on_loopback()  # before ray is imported
import ray
from ray.cluster_utils import Cluster

out, text = Path(sys.argv[1]), Path(sys.argv[2]).read_text()
head = {"node_ip_address": "127.0.0.1", "object_store_memory": 80 * 2**20}
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, **head})
try:
    for i in range(3):  # each worker node on an address of its own, with scratch space of its own
        scratch = {"TB_NODE_SCRATCH": str(out) + f"-scratch{i}"}
        cluster.add_node(num_cpus=1, **{**head, "node_ip_address": f"127.0.0.{i + 2}"}, env_vars=scratch)
    cluster.wait_for_nodes()
    scenario = testbed.parse_scenario(text, "node_loss.yaml")
    result = testbed.run(scenario, out, address=cluster.address)
    scratch = "$TB_NODE_SCRATCH/ckpt"  # each node's own
    local = testbed.run(scenario, str(out) + "-local", address=cluster.address, storage=scratch)
    print(json.dumps({"verdict": result.verdict, "exit": result.exit_code, "local": local.exit_code,
                      "local_error": local.data["error"]}))
finally:
    ray.shutdown()
    cluster.shutdown()
"""


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_each_supernode_gets_a_ray_node_and_losing_one_is_recovered_on_the_spare(tmp_path: Path) -> None:
    (tmp_path / "scenario.yaml").write_text(SCENARIO)
    (tmp_path / "driver.py").write_text(textwrap.dedent(DRIVER))
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "run"), str(tmp_path / "scenario.yaml")],
        cwd=ROOT,
        env={**os.environ, "TB_NODE_SCRATCH": str(tmp_path / "driver-scratch")},  # the driver's own
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcome = json.loads(proc.stdout.strip().splitlines()[-1])
    events = [json.loads(line) for line in (tmp_path / "run" / "journal.jsonl").read_text().splitlines()]
    checks = json.loads((tmp_path / "run" / "report.json").read_text())["checks"]
    assert (outcome["verdict"], outcome["exit"]) == ("pass", 0), checks
    (started,) = [e for e in events if e["event"] == "cluster_started"]
    nodes = started["nodes"]
    assert started["placement"] == "STRICT_SPREAD"
    assert nodes["0"] == nodes["1"] and nodes["2"] == nodes["3"] and nodes["0"] != nodes["2"]
    # each supernode's NPUs listen on their own node's address: traffic between them crosses addresses
    hosts = started["hosts"]
    assert hosts["0"] == hosts["1"] and hosts["2"] == hosts["3"] and hosts["0"] != hosts["2"]
    assert {hosts["0"], hosts["2"]} <= {"127.0.0.2", "127.0.0.3", "127.0.0.4"}
    (shared,) = [e for e in events if e["event"] == "storage_shared"]
    assert shared["supernodes"] == 2  # the run folder, seen by both supernodes' nodes
    # a storage path that names each node's own scratch space is not shared: refused before training
    assert outcome["local"] == 254
    assert "is not shared" in outcome["local_error"] and "every node mounts" in outcome["local_error"]
    (injected,) = [e for e in events if e["event"] == "fault_injected"]
    assert injected["record"]["node"] == nodes["2"] and injected["record"]["ranks"] == [2, 3]
    (failure,) = [e for e in events if e["event"] == "failure_detected"]
    assert failure["dead"] == [2, 3] and {k["point"] for k in failure["killed"]} == {"ray_node"}
    replaced = {e["rank"]: e["node"] for e in events if e["event"] == "npu_replaced"}
    assert set(replaced) == {2, 3} and replaced[2] == replaced[3]
    assert replaced[2] not in (nodes["0"], nodes["2"])  # the spare node took the lost supernode


def test_a_ray_node_loss_needs_a_supernode_target_at_a_boundary() -> None:
    from testbed.core.errors import ScenarioError
    from testbed.scenario.parse import parse_scenario

    bad = SCENARIO.replace("target: {supernode: 1}", "target: {rank: 1}")
    with pytest.raises(ScenarioError) as err:
        parse_scenario(bad, "bad.yaml")
    assert "faults[0].scope" in str(err.value) and "target: {supernode: N}" in str(err.value)
    with pytest.raises(ScenarioError) as err:
        parse_scenario(SCENARIO.replace("scope: ray_node", "scope: rack"), "bad.yaml")
    assert "scope must be process or ray_node" in str(err.value)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_ray_node_loss_on_a_single_node_ray_is_refused_with_254(tmp_path: Path) -> None:
    from testbed.control.runner import run
    from testbed.scenario.parse import parse_scenario

    result = run(parse_scenario(SCENARIO, "node_loss.yaml"), tmp_path / "single")
    assert (result.verdict, result.exit_code) == ("invalid", 254)
    assert "needs a Ray cluster of several nodes" in str(result.data["error"])
    assert (result.out_dir / "journal.jsonl").is_file()
