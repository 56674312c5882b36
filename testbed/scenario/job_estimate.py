"""The estimate of a scenario's job: its job section on its layout, preset and recovery policy."""

from __future__ import annotations

from testbed.job.estimate import Estimate, estimate
from testbed.job.figures import job_topology
from testbed.scenario.model import Scenario


def scenario_estimate(scenario: Scenario) -> Estimate | None:
    """What ``testbed estimate`` prints and a run is checked against (None without a ``job``): a
    failure costs the detection's timeout and the policy's restart before the load."""
    if scenario.job is None:
        return None
    run = scenario.cluster.topology()
    job = scenario.job.job(scenario.workload.layout(), run.preset)
    detection = scenario.policy.detection
    restart_s = (detection.timeout_s if detection else 0.0) + scenario.policy.recovery.restart_s
    return estimate(job, job_topology(job, run), restart_s, scenario.policy.collectives.algorithm)
