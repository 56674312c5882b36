"""The estimate of a scenario's job (its job section on its layout, preset and recovery policy) and
of its serving deployment (its serve section on its preset)."""

from __future__ import annotations

from testbed.core.units import parse_duration
from testbed.job.estimate import Estimate, estimate
from testbed.job.figures import job_topology
from testbed.job.spec import Job
from testbed.scenario.model import Scenario
from testbed.serve.estimate import ServeEstimate, serve_estimate


def scenario_job(scenario: Scenario) -> Job | None:
    """The scenario's modelled job on its NPU preset (None without a ``job`` section)."""
    if scenario.job is None:
        return None
    return scenario.job.job(scenario.workload.layout(), scenario.cluster.topology().preset)


def scenario_mtbf_s(scenario: Scenario) -> float | None:
    """The mean interval of the failures the scenario's ``at: {mtbf: ...}`` faults give (their rates
    added), None if it has none."""
    mtbfs = [parse_duration(f.at["mtbf"]) for f in scenario.faults if "mtbf" in f.at]
    known = [m for m in mtbfs if m]
    if not known:
        return None
    # one process as given: a round trip through its rate could move the last bit of `mtbf: job`
    return known[0] if len(known) == 1 else 1.0 / sum(1.0 / m for m in known)


def scenario_estimate(scenario: Scenario) -> Estimate | None:
    """What ``testbed estimate`` prints and a run is checked against (None without a ``job``): a
    failure costs the detection's timeout and the policy's restart before the load; failures come
    as the scenario's faults give them, else at the job's size."""
    job = scenario_job(scenario)
    if job is None:
        return None
    detection = scenario.policy.detection
    restart_s = (detection.timeout_s if detection else 0.0) + scenario.policy.recovery.restart_s
    topo = job_topology(job, scenario.cluster.topology())
    return estimate(job, topo, restart_s, scenario.policy.collectives.algorithm, scenario_mtbf_s(scenario))


def scenario_serve_estimate(scenario: Scenario) -> ServeEstimate | None:
    """What ``testbed estimate`` prints of the scenario's serving (None without a ``serve``)."""
    s = scenario.serve
    if s is None:
        return None
    dep = s.deployment(scenario.cluster.topology().preset)
    return serve_estimate(dep, s.batch, s.context, s.prompt, s.slo.tpot_s)
