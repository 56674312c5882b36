"""The scenario's stream served by fresh instances in the controller's process: what the serving
run's references and counterfactuals (undisturbed, co-located, autoscaled, disaggregated) are."""

from __future__ import annotations

from testbed.scenario.model import Scenario
from testbed.serve import metrics
from testbed.serve.disaggregation import Pools
from testbed.serve.fleet import Fleet, Outcome
from testbed.serve.rank import InstanceConfig
from testbed.serve.requests import Request


def served(
    scenario: Scenario,
    configs: list[InstanceConfig],
    requests: tuple[Request, ...],
    pools: Pools | None = None,
) -> tuple[dict[str, Outcome], metrics.ServingFigures]:
    """Each request's outcome on fresh instances of ``configs`` (in ``pools``, if disaggregated),
    and the figures under the scenario's SLO."""
    s = scenario.serve
    assert s is not None
    outcomes = Fleet([c.instance() for c in configs], requests, pools=pools).run()
    return outcomes, metrics.figures(outcomes.values(), s.slo.ttft_s, s.slo.tpot_s)
