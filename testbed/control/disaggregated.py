"""Prefill/decode disaggregation in a serving run: the pools, the KV transfers' link, and what
disaggregating changed against the same instances serving both phases.

The pools are the first ``prefill`` instances and the rest. A transfer
between two instances takes the link between their first ranks on the
scenario's cluster (``latency + bytes / bandwidth``: the supernode's fabric
inside one, the network between two). Beside the run, the same stream is
served in this process twice with no fault, disaggregated and mixed (every
instance prefilling and decoding), and the ``disaggregation`` event sets
their tails side by side.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from testbed.control import in_process
from testbed.scenario.model import Scenario
from testbed.serve.colocation import Interference
from testbed.serve.disaggregation import Pools
from testbed.serve.rank import InstanceConfig
from testbed.serve.requests import Request


def role(scenario: Scenario, k: int) -> str:
    """Instance ``k``'s role: ``prefill`` or ``decode`` when disaggregated, else ``both``."""
    s = scenario.serve
    assert s is not None
    if s.disaggregation is None:
        return "both"
    return "prefill" if k < s.disaggregation.prefill else "decode"


def pools(scenario: Scenario, names: list[str], groups: list[list[int]]) -> Pools | None:
    """The pools of a disaggregated scenario (None if it is not), transfers timed on its cluster."""
    s = scenario.serve
    assert s is not None
    if s.disaggregation is None:
        return None
    topology = scenario.cluster.topology()
    first = {n: g[0] for n, g in zip(names, groups, strict=True)}

    def transfer_s(src: str, dst: str, nbytes: int) -> float:
        link = topology.link(first[src], first[dst])
        return link.latency_s + nbytes / link.bandwidth_Bps

    p = s.disaggregation.prefill
    return Pools(tuple(names[:p]), tuple(names[p:]), transfer_s)


def _figures(
    scenario: Scenario, configs: list[InstanceConfig], requests: tuple[Request, ...], split: Pools | None
) -> dict[str, float]:
    calm = [replace(c, interference=Interference(), role=c.role if split else "both") for c in configs]
    _, f = in_process.served(scenario, calm, requests, split)
    keys = (
        "ttft_p50_s",
        "ttft_p99_s",
        "tpot_p50_s",
        "tpot_p99_s",
        "itl_p99_s",
        "slo_attainment",
        "tokens_per_s",
    )
    return {k: f.as_dict()[k] for k in keys}


def effects(
    scenario: Scenario,
    configs: list[InstanceConfig],
    requests: tuple[Request, ...],
    split: Pools,
    transfers: list[dict[str, Any]],
) -> dict[str, Any]:
    """The ``disaggregation`` event: the pools, the run's transfers, and the stream's tails served
    disaggregated and mixed, undisturbed."""
    total = sum(int(t["bytes"]) for t in transfers)
    times = [float(t["ready_s"]) - float(t["start_s"]) for t in transfers]
    return {
        "prefill": list(split.prefill),
        "decode": list(split.decode),
        "transfers": len(transfers),
        "bytes": total,
        "transfer_mean_s": sum(times) / len(times) if times else 0.0,
        "transfer_max_s": max(times, default=0.0),
        "disaggregated": _figures(scenario, configs, requests, split),
        "mixed": _figures(scenario, configs, requests, None),
    }
