"""What autoscaling bought: the run's instance-seconds and SLO share beside fixed fleets.

Beside the autoscaled run on the NPU processes, the same stream is served in
this process by a fleet fixed at the policy's minimum and by one fixed at
the most instances, with the run's caches and batching and no fault. The
``autoscaling`` event sets the three side by side: what each spent in
instance-seconds (an instance counts from its start, loading included, to
its stop or the last token) and what share of requests met the SLO.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from testbed.control import in_process
from testbed.scenario.model import Scenario
from testbed.serve import metrics
from testbed.serve.autoscale import Scaler
from testbed.serve.colocation import Interference
from testbed.serve.fleet import Outcome
from testbed.serve.rank import InstanceConfig
from testbed.serve.requests import Request


def _end(outcomes: dict[str, Outcome], requests: tuple[Request, ...]) -> float:
    """The last token of the run (or its last arrival, if no token came after it)."""
    finishes = [o.finish_s for o in outcomes.values() if o.finish_s is not None]
    return max([*finishes, *(r.arrival_s for r in requests)], default=0.0)


def _fixed(
    scenario: Scenario, configs: list[InstanceConfig], requests: tuple[Request, ...], n: int
) -> dict[str, float]:
    outcomes, f = in_process.served(
        scenario, [replace(c, interference=Interference()) for c in configs[:n]], requests
    )
    return {
        "instances": n,
        "instance_s": n * _end(outcomes, requests),
        "slo_attainment": f.slo_attainment,
        "ttft_p99_s": f.ttft_p99_s,
    }


def effects(
    scenario: Scenario,
    configs: list[InstanceConfig],
    requests: tuple[Request, ...],
    scaler: Scaler,
    outcomes: dict[str, Outcome],
) -> dict[str, Any]:
    """The ``autoscaling`` event: the run's starts, stops, peak and instance-seconds, and the fixed
    fleets' figures."""
    s = scenario.serve
    assert s is not None and s.autoscale is not None
    run = metrics.figures(outcomes.values(), s.slo.ttft_s, s.slo.tpot_s)
    return {
        "starts": sum(x.action == "out" for x in scaler.log),
        "stops": sum(x.action == "in" for x in scaler.log),
        "peak": scaler.peak,
        "instance_s": scaler.finish(_end(outcomes, requests)),
        "slo_attainment": run.slo_attainment,
        "fixed": {
            "min": _fixed(scenario, configs, requests, s.autoscale.min),
            "max": _fixed(scenario, configs, requests, s.instances),
        },
    }
