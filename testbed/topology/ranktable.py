"""A cluster from an HCCL rank table file (JSON), as Ascend jobs describe theirs.

Version 1.0 lists servers, each with its devices and their ``rank_id``: every
server is a supernode of the ``atlas-800t-a2`` preset (8 NPUs on HCCS).
Version 1.2 adds ``super_pod_list``: every super pod, with the servers it
holds, is a supernode of the ``atlas-900-a3`` preset. Every supernode must
hold the same number of devices, and rank ids must run 0..N-1 supernode by
supernode (the testbed places rank r on supernode r // size), so that the
table and the modelled placement agree; anything else is a problem naming
the field and the fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RankTable:
    """What a rank table says about the cluster."""

    preset: str
    supernodes: int
    npus_per_supernode: int
    version: str


def _devices(server: Any, where: str, problems: list[str]) -> list[int]:
    devices = server.get("device") if isinstance(server, dict) else None
    if not isinstance(devices, list) or not devices:
        problems.append(f"{where}.device: expected a list of devices, each with a rank_id")
        return []
    ranks = []
    for j, dev in enumerate(devices):
        rank = dev.get("rank_id") if isinstance(dev, dict) else None
        try:
            ranks.append(int(str(rank)))
        except ValueError:
            problems.append(f"{where}.device[{j}].rank_id: expected a rank number, got {rank!r}")
    return ranks


def _groups(data: dict[str, Any], problems: list[str]) -> tuple[str, list[list[int]]]:
    """(version, the rank ids of each supernode in order)."""
    version = str(data.get("version"))
    servers = data.get("server_list")
    if not isinstance(servers, list) or not servers:
        problems.append("server_list: expected a list of servers")
        return version, []
    by_id = {}
    for i, server in enumerate(servers):
        sid = server.get("server_id") if isinstance(server, dict) else None
        by_id[str(sid)] = _devices(server, f"server_list[{i}]", problems)
    if version == "1.0":
        return version, list(by_id.values())
    pods = data.get("super_pod_list")
    if not isinstance(pods, list) or not pods:
        problems.append("super_pod_list: version 1.2 needs a list of super pods, each with its server_list")
        return version, []
    groups = []
    for i, pod in enumerate(pods):
        members = pod.get("server_list") if isinstance(pod, dict) else None
        if not isinstance(members, list) or not members:
            problems.append(f"super_pod_list[{i}].server_list: expected the servers of this super pod")
            continue
        ranks: list[int] = []
        for j, member in enumerate(members):
            sid = str(member.get("server_id") if isinstance(member, dict) else member)
            if sid not in by_id:
                problems.append(f"super_pod_list[{i}].server_list[{j}]: server '{sid}' is not in server_list")
            ranks += by_id.get(sid, [])
        groups.append(ranks)
    return version, groups


def read_rank_table(path: Path) -> tuple[RankTable | None, list[str]]:
    """The cluster a rank table describes, or None and every problem found (each naming its field)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        return None, [f"cannot read it ({exc.__class__.__name__}: {exc})"]
    except json.JSONDecodeError as exc:
        return None, [f"not valid JSON (line {exc.lineno}: {exc.msg})"]
    if not isinstance(data, dict):
        return None, ["expected a JSON object with version and server_list"]
    if str(data.get("version")) not in ("1.0", "1.2"):
        return None, [
            f"version: {data.get('version')!r} is not a rank table version this reads; use 1.0 or 1.2"
        ]
    problems: list[str] = []
    version, groups = _groups(data, problems)
    if problems or not groups:
        return None, problems or ["no supernode found"]
    size = len(groups[0])
    odd = [i for i, g in enumerate(groups) if len(g) != size]
    if odd:
        what = "super pod" if version == "1.2" else "server"
        problems.append(
            f"{what} {odd[0]} has {len(groups[odd[0]])} devices, {what} 0 has {size}; every {what} needs the "
            "same count"
        )
    for s, ranks in enumerate(groups):
        expected = list(range(s * size, (s + 1) * size))
        if sorted(ranks) != expected:
            problems.append(
                f"the ranks of supernode {s} are {sorted(ranks)}, not {expected[0]}..{expected[-1]}; "
                "number rank_id supernode by supernode from 0"
            )
            break
    if problems:
        return None, problems
    preset = "atlas-900-a3" if version == "1.2" else "atlas-800t-a2"
    return RankTable(preset, len(groups), size, version), []
