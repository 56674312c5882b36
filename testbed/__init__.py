"""Supernode resilience testbed: rehearse training failures on Ray actors with modelled time.

The public API. Drive a run from Python::

    import testbed

    scenario = testbed.load_scenario("scenarios/quickstart.yaml").with_seed(7)
    report = testbed.run(scenario, "runs/quickstart-7")
    print(report.verdict, report.check("recovered").summary)

and extend the testbed with fault kinds, recovery strategies, checks and
workloads of your own (:func:`register_fault_kind`, :func:`register_strategy`,
:func:`register_check`, :func:`register_workload`, or the entry-point groups
``testbed.fault_kinds``, ``testbed.recovery_strategies``, ``testbed.checks``
and ``testbed.workloads``; see docs/extending.md).

Importing the package has no side effects and imports nothing else: each
name below is imported from its layer the first time it is used. The
environment is left as it is; :func:`keep_ray_on_loopback` is for programs
that import ``ray`` themselves.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from faults.kind import ClusterFacts, FaultKind, FaultSpec, Injector, PlannedFault
    from faults.kind import register as register_fault_kind
    from testbed.actors.loopback import keep_ray_on_loopback
    from testbed.control.resume import resume
    from testbed.control.runner import run
    from testbed.core.errors import ScenarioError, TestbedError
    from testbed.recovery.context import RecoveryContext
    from testbed.recovery.registry import Strategy, register_strategy
    from testbed.report.check_result import CheckResult
    from testbed.report.checks import register_check
    from testbed.report.run_report import Report
    from testbed.scenario.expect import Expect
    from testbed.scenario.model import Scenario
    from testbed.scenario.parse import load_scenario, parse_scenario
    from testbed.train.step_context import StepContext
    from workloads.base import StepBuffers, Workload, WorkloadInfo
    from workloads.base import register as register_workload

__version__ = "0.2.0"

#: each public name and the module that defines it (imported on first use)
_HOMES: dict[str, tuple[str, str]] = {
    # a run
    "load_scenario": ("testbed.scenario.parse", "load_scenario"),
    "parse_scenario": ("testbed.scenario.parse", "parse_scenario"),
    "Scenario": ("testbed.scenario.model", "Scenario"),
    "Expect": ("testbed.scenario.model", "Expect"),
    "run": ("testbed.control.runner", "run"),
    "resume": ("testbed.control.resume", "resume"),
    "Report": ("testbed.report.run_report", "Report"),
    "TestbedError": ("testbed.core.errors", "TestbedError"),
    "ScenarioError": ("testbed.core.errors", "ScenarioError"),
    "keep_ray_on_loopback": ("testbed.actors.loopback", "keep_ray_on_loopback"),
    # fault kinds
    "FaultKind": ("faults.kind", "FaultKind"),
    "FaultSpec": ("faults.kind", "FaultSpec"),
    "PlannedFault": ("faults.kind", "PlannedFault"),
    "ClusterFacts": ("faults.kind", "ClusterFacts"),
    "Injector": ("faults.kind", "Injector"),
    "register_fault_kind": ("faults.kind", "register"),
    # recovery strategies
    "Strategy": ("testbed.recovery.registry", "Strategy"),
    "RecoveryContext": ("testbed.recovery.context", "RecoveryContext"),
    "register_strategy": ("testbed.recovery.registry", "register_strategy"),
    # checks
    "CheckResult": ("testbed.report.check_result", "CheckResult"),
    "register_check": ("testbed.report.checks", "register_check"),
    # workloads
    "Workload": ("workloads.base", "Workload"),
    "WorkloadInfo": ("workloads.base", "WorkloadInfo"),
    "StepBuffers": ("workloads.base", "StepBuffers"),
    "StepContext": ("testbed.train.step_context", "StepContext"),
    "register_workload": ("workloads.base", "register"),
}

__all__ = [
    "CheckResult",
    "ClusterFacts",
    "Expect",
    "FaultKind",
    "FaultSpec",
    "Injector",
    "PlannedFault",
    "RecoveryContext",
    "Report",
    "Scenario",
    "ScenarioError",
    "StepBuffers",
    "StepContext",
    "Strategy",
    "TestbedError",
    "Workload",
    "WorkloadInfo",
    "keep_ray_on_loopback",
    "load_scenario",
    "parse_scenario",
    "register_check",
    "register_fault_kind",
    "register_strategy",
    "register_workload",
    "resume",
    "run",
]


def __getattr__(name: str) -> Any:
    """Import a public name from its home on first use (PEP 562)."""
    if name not in _HOMES:
        raise AttributeError(f"module 'testbed' has no attribute '{name}'; the public names are {__all__}")
    module, attr = _HOMES[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
