"""What a workload is to the engine, and the registry that finds workloads by name."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from testbed.checkpoint import COMPONENTS

if TYPE_CHECKING:
    from testbed.parallel import StepContext

__all__ = ["COMPONENTS", "Arrays", "StepBuffers", "Workload", "WorkloadInfo", "register"]

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
    """A deterministic numpy training job on one rank.

    A step is three calls: :meth:`forward_backward` (which may talk to its
    TP, PP and EP groups and charges its compute through the context),
    :meth:`sync_grads` (the data-parallel gradient reduction, the part HCCL's
    op retry may run again) and :meth:`apply` (clipping and the optimizer).
    Factories take ``(options, seed, rank, layout)``.
    """

    components: tuple[str, ...]

    def flops_per_step(self) -> float:
        """FLOPs of one step on this rank, from the shapes."""

    def forward_backward(self, ctx: StepContext) -> tuple[float | None, Arrays, int]:
        """This rank's forward and backward passes: (loss, or None off the last stage; grads; samples)."""

    def sync_plan(self) -> dict[str, int]:
        """Bytes :meth:`sync_grads` allreduces per step, per group name (to choose and warm up algorithms)."""

    def sync_grads(self, ctx: StepContext, grads: Arrays) -> Arrays:
        """Average the gradients over the data-parallel replicas."""

    def apply(self, ctx: StepContext, grads: Arrays) -> float:
        """Clip and apply averaged gradients; returns the learning rate used."""

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
    #: what makes (options, layout) unusable, one message with its fix each
    validate: Callable[[Mapping[str, Any], Any], list[str]] | None = None
    #: whether every rank's RNG state must differ (per-rank streams); the checkpoint audit checks it
    rng_per_rank: bool = True


WORKLOADS: dict[str, WorkloadInfo] = {}


def register(info: WorkloadInfo) -> WorkloadInfo:
    """Add a workload to the registry under its name."""
    WORKLOADS[info.name] = info
    return info
