"""Co-location's attribution: how much each of training's bursts raises serving's tail, and what
the scenario's policy leaves of it.

The serving run on the NPU processes runs under the scenario's policy. Beside
it, the same stream is served in this process against the same training
timeline five ways: alone (no window), under the checkpoints' windows only,
under the allreduces' only, under both with no policy, and under both with
the policy. The differences from "alone" are what the journal attributes to
each burst; the last is what the run itself must match.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from testbed.control import in_process
from testbed.scenario.model import Scenario
from testbed.serve.colocation import Interference
from testbed.serve.rank import InstanceConfig
from testbed.serve.requests import Request

#: the counterfactuals, each the windows it keeps and whether the policy applies
VARIANTS = {
    "alone": ((), False),
    "checkpoint": (("checkpoint",), False),
    "allreduce": (("allreduce",), False),
    "both": (("checkpoint", "allreduce"), False),
    "policy": (("checkpoint", "allreduce"), True),
}


def _figures(
    scenario: Scenario, configs: list[InstanceConfig], requests: tuple[Request, ...]
) -> dict[str, float]:
    _, f = in_process.served(scenario, configs, requests)
    return {
        "ttft_p99_s": f.ttft_p99_s,
        "tpot_p99_s": f.tpot_p99_s,
        "itl_p99_s": f.itl_p99_s,
        "latency_p99_s": f.latency_p99_s,
        "slo_attainment": f.slo_attainment,
        "lost": f.lost,
    }


def effects(
    scenario: Scenario, configs: list[InstanceConfig], requests: tuple[Request, ...], full: Interference
) -> dict[str, Any]:
    """The ``colocation`` event: each variant's figures, and the rise each burst causes."""
    s = scenario.serve
    assert s is not None and s.colocation is not None
    policy = s.colocation.policy
    variants = {}
    for name, (kinds, protected) in VARIANTS.items():
        interference = full.only(*kinds)
        if protected:
            interference = interference.under(policy)
        variants[name] = _figures(scenario, [_with(c, interference) for c in configs], requests)
    alone = variants["alone"]
    rise = {
        burst: {
            k: variants[burst][k] - alone[k]
            for k in ("ttft_p99_s", "tpot_p99_s", "itl_p99_s", "latency_p99_s")
        }
        for burst in ("checkpoint", "allreduce", "both")
    }
    counts = {kind: sum(w.kind == kind for w in full.windows) for kind in ("checkpoint", "allreduce")}
    return {"policy": policy, "windows": counts, "variants": variants, "rise": rise}


def _with(config: InstanceConfig, interference: Interference) -> InstanceConfig:
    return replace(config, interference=interference)
