"""Test helper: ranks as threads in this process, each with a real data plane and an endpoint."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from testbed.collectives import Communicator, Endpoint
from testbed.core.secret import RunSecret
from testbed.fabric.clock import RankClock
from testbed.fabric.dataplane import DataPlane
from testbed.fabric.linkfaults import LinkFaultTable
from testbed.topology.presets import PRESETS, Topology


def topology(supernodes: int, per_node: int, preset: str = "atlas-900-a3") -> Topology:
    return Topology(PRESETS[preset], supernodes, per_node)


def run_group(
    topo: Topology,
    members: list[int],
    fn: Callable[[Communicator], Any],
    *,
    guard_s: float = 20.0,
    faults: LinkFaultTable | None = None,
    exec_timeout_s: float = 1836.0,
    connect_timeout_s: float = 120.0,
    versions: dict[int, str] | None = None,
    dying: set[int] | None = None,
) -> dict[int, tuple[Any, Endpoint]]:
    """Run ``fn`` on every member at once; returns each rank's result (or error) and its endpoint.

    Ranks in ``dying`` close their data plane instead (a dead process), and the
    others are told, as the controller does.
    """
    secret = RunSecret.new()
    planes = {r: DataPlane(r, secret, guard_s=guard_s) for r in members}
    addrs = {r: p.address for r, p in planes.items()}
    eps = {}
    for r, plane in planes.items():
        ep = Endpoint(
            r,
            plane,
            RankClock(),
            topo,
            seed=7,
            connect_timeout_s=connect_timeout_s,
            exec_timeout_s=exec_timeout_s,
            faults=faults or LinkFaultTable(),
        )
        if versions and r in versions:
            ep.version = versions[r]
        ep.new_epoch(0, addrs)
        eps[r] = ep
    results: dict[int, tuple[Any, Endpoint]] = {}

    def rank_main(r: int) -> None:
        if dying and r in dying:
            planes[r].close()
            for other in members:
                if other not in dying:
                    planes[other].mark_dead(r)
            results[r] = ("dead", eps[r])
            return
        try:
            results[r] = (fn(Communicator(eps[r], "g", members)), eps[r])
        except Exception as exc:
            results[r] = (exc, eps[r])

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in members]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=guard_s * 3)
    for p in planes.values():
        p.close()
    assert len(results) == len(members), f"ranks {sorted(set(members) - set(results))} never finished"
    return results
