"""What a workload is to the engine, and the registry that finds workloads by name."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

#: Every checkpointable component a training job has. A workload declares the
#: ones it owns; the completeness check compares a checkpoint against them.
COMPONENTS = ("params", "optimizer", "lr_scheduler", "rng", "data_cursor")

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class StepBuffers:
    """The device buffers of one training step, in bytes, in the order the step allocates them.

    ``workspace`` is freed when the forward pass ends, ``activations`` when the
    backward pass ends, ``grads`` and ``comm`` after the update; ``keep`` is a
    small tensor the step leaves behind for good (a logged metric, a growing
    cache): interleaved with buffers of varying size, such leftovers are what
    fragments a caching allocator over hours.
    """

    workspace: int
    activations: int
    keep: int
    grads: int
    comm: int


class Workload(Protocol):
    """A deterministic numpy training job on one rank."""

    components: tuple[str, ...]

    def flops_per_step(self) -> float:
        """FLOPs of one step on this rank, from the shapes."""

    def forward_backward(self) -> tuple[float, Arrays, int]:
        """Run one local forward and backward; returns (loss, grads, samples)."""

    def apply(self, grads: Arrays) -> float:
        """Apply averaged gradients; returns the learning rate used."""

    def state(self, component: str) -> Arrays:
        """The arrays of one checkpointable component."""

    def load(self, component: str, arrays: Mapping[str, np.ndarray]) -> None:
        """Restore one component from arrays written by :meth:`state`."""

    def params_digest(self) -> str:
        """sha256 of the parameters' bytes, in a fixed order."""

    def persistent_bytes(self) -> dict[str, int]:
        """Tensors that live in device memory for the whole run (parameters, optimizer state)."""

    def step_bytes(self, step: int) -> StepBuffers:
        """The transient device buffers of one step."""


@dataclass(frozen=True)
class WorkloadInfo:
    """A registered workload: its factory, its options and a one-line description."""

    name: str
    description: str
    factory: Callable[..., Workload]
    options: Mapping[str, Any]


WORKLOADS: dict[str, WorkloadInfo] = {}


def register(info: WorkloadInfo) -> WorkloadInfo:
    """Add a workload to the registry under its name."""
    WORKLOADS[info.name] = info
    return info
