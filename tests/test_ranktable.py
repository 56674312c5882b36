"""A cluster from an HCCL rank table: versions 1.0 and 1.2, every inconsistency named, paths confined."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from testbed.control.runner import run
from testbed.core.errors import ScenarioError
from testbed.scenario.parse import load_scenario, parse_scenario
from testbed.topology.ranktable import read_rank_table
from tests.conftest import SCENARIOS


def table_v10(servers: int = 2, per: int = 8) -> dict[str, Any]:
    return {
        "version": "1.0",
        "server_count": str(servers),
        "status": "completed",
        "server_list": [
            {
                "server_id": f"10.0.0.{s}",
                "device": [{"device_id": str(d), "rank_id": str(s * per + d)} for d in range(per)],
            }
            for s in range(servers)
        ],
    }


def write(tmp_path: Path, table: Any, name: str = "hccl.json") -> Path:
    path = tmp_path / name
    path.write_text(table if isinstance(table, str) else json.dumps(table))
    return path


def test_version_1_0_makes_each_server_a_supernode_of_the_a2_preset(tmp_path: Path) -> None:
    table, problems = read_rank_table(write(tmp_path, table_v10()))
    assert problems == [] and table is not None
    assert (table.preset, table.supernodes, table.npus_per_supernode) == ("atlas-800t-a2", 2, 8)


def test_version_1_2_makes_each_super_pod_a_supernode_of_the_a3_preset() -> None:
    table, problems = read_rank_table(SCENARIOS / "rank_table_a3.json")
    assert problems == [] and table is not None
    assert (table.preset, table.supernodes, table.npus_per_supernode, table.version) == (
        "atlas-900-a3",
        2,
        4,
        "1.2",
    )


def _broken(change: str) -> Any:
    t = table_v10()
    if change == "uneven":
        t["server_list"][1]["device"].pop()
    elif change == "order":
        t["server_list"][0]["device"][0]["rank_id"] = "9"
        t["server_list"][1]["device"][1]["rank_id"] = "0"
    elif change == "version":
        t["version"] = "2.0"
    elif change == "rank-text":
        t["server_list"][0]["device"][3]["rank_id"] = "three"
    elif change == "no-servers":
        t["server_list"] = []
    elif change == "pods":
        t["version"] = "1.2"
        t["super_pod_list"] = [{"super_pod_id": "0", "server_list": [{"server_id": "10.0.0.7"}]}]
    elif change == "json":
        return "{not json"
    return t


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ("uneven", "server 1 has 7 devices, server 0 has 8"),
        ("order", "number rank_id supernode by supernode from 0"),
        ("version", "use 1.0 or 1.2"),
        ("rank-text", "server_list[0].device[3].rank_id: expected a rank number"),
        ("no-servers", "server_list: expected a list of servers"),
        ("pods", "server '10.0.0.7' is not in server_list"),
        ("json", "not valid JSON (line 1"),
    ],
)
def test_an_inconsistent_rank_table_is_refused_naming_the_field(
    tmp_path: Path, change: str, needle: str
) -> None:
    table, problems = read_rank_table(write(tmp_path, _broken(change)))
    assert table is None and any(needle in p for p in problems), problems


def scenario(cluster: str) -> str:
    return (
        "version: 1\nname: rt\nseed: 1\n"
        f"cluster: {cluster}\n"
        "workload: {name: mlp, steps: 4, parallel: {dp: 16}, hidden: 16}\n"
    )


def test_a_scenario_takes_its_cluster_from_a_rank_table_beside_it(tmp_path: Path) -> None:
    write(tmp_path, table_v10())
    s = parse_scenario(scenario("{rank_table: hccl.json}"), str(tmp_path / "s.yaml"))
    assert (s.cluster.preset, s.cluster.supernodes, s.cluster.npus_per_supernode) == ("atlas-800t-a2", 2, 8)


@pytest.mark.parametrize(
    ("cluster", "needle"),
    [
        ("{rank_table: ../hccl.json}", "outside the scenario's folder"),
        ("{rank_table: /etc/hccl.json}", "outside the scenario's folder"),
        ("{rank_table: hccl.json, supernodes: 2}", "'supernodes' is set by the rank table"),
        ("{rank_table: missing.json}", "rank table missing.json: cannot read it"),
        ("{rank_table: 7}", "expected the path of an HCCL rank table"),
    ],
)
def test_rank_table_paths_are_confined_and_conflicts_named(tmp_path: Path, cluster: str, needle: str) -> None:
    inner = tmp_path / "inner"
    inner.mkdir()
    write(tmp_path, table_v10())
    write(inner, table_v10())
    with pytest.raises(ScenarioError) as err:
        parse_scenario(scenario(cluster), str(inner / "s.yaml"))
    assert needle in str(err.value) and "s.yaml:4" in str(err.value)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_the_rank_table_scenario_runs_and_recovers(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIOS / "rank_table.yaml"), tmp_path / "rt")
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
