"""Deterministic numpy training workloads, found by name through :data:`WORKLOADS`."""

from workloads import mlp, transformer
from workloads.base import COMPONENTS, WORKLOADS, Workload, WorkloadInfo

__all__ = ["COMPONENTS", "WORKLOADS", "Workload", "WorkloadInfo", "mlp", "transformer"]
