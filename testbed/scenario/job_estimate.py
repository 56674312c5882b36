"""The estimate of a scenario's job: its job section on its layout, preset and recovery policy."""

from __future__ import annotations

from testbed.job.estimate import Estimate, estimate
from testbed.job.figures import job_topology
from testbed.job.spec import Job
from testbed.scenario.model import Scenario


def scenario_job(scenario: Scenario) -> Job | None:
    """The scenario's modelled job on its NPU preset (None without a ``job`` section)."""
    if scenario.job is None:
        return None
    return scenario.job.job(scenario.workload.layout(), scenario.cluster.topology().preset)


def scenario_estimate(scenario: Scenario) -> Estimate | None:
    """What ``testbed estimate`` prints and a run is checked against (None without a ``job``): a
    failure costs the detection's timeout and the policy's restart before the load."""
    job = scenario_job(scenario)
    if job is None:
        return None
    detection = scenario.policy.detection
    restart_s = (detection.timeout_s if detection else 0.0) + scenario.policy.recovery.restart_s
    topo = job_topology(job, scenario.cluster.topology())
    return estimate(job, topo, restart_s, scenario.policy.collectives.algorithm)
