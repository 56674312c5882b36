"""Deterministic numpy training workloads, found by name through :data:`WORKLOADS`."""

from workloads import mlp
from workloads.base import COMPONENTS, WORKLOADS, StepOutcome, Workload, WorkloadInfo

__all__ = ["COMPONENTS", "WORKLOADS", "StepOutcome", "Workload", "WorkloadInfo", "mlp"]
