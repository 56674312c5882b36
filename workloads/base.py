"""What a workload is to the engine, and the registry that finds workloads by name."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from testbed.core.errors import TestbedError
from testbed.core.registry import Registry
from testbed.train.checkpoint import COMPONENTS

if TYPE_CHECKING:
    from testbed.train.step_context import StepContext

__all__ = [
    "COMPONENTS",
    "Arrays",
    "Output",
    "StepBuffers",
    "Workload",
    "WorkloadInfo",
    "digest",
    "moments_from",
    "moments_state",
    "register",
    "unchanged",
]

Arrays = dict[str, np.ndarray]

#: shown each value a step makes, ``(kind, name, value)``, returns the value to go on with (see
#: ``StepContext.output``)
Output = Callable[[str, str, np.ndarray], np.ndarray]


def unchanged(kind: str, name: str, value: np.ndarray) -> np.ndarray:
    """An :data:`Output` that changes nothing (a step no fault can reach)."""
    return value


def digest(params: Mapping[str, np.ndarray]) -> str:
    """sha256 over named arrays, in name order (a rank's parameter digest)."""
    h = hashlib.sha256()
    for k in sorted(params):
        h.update(k.encode())
        h.update(np.ascontiguousarray(params[k]).tobytes())
    return h.hexdigest()


def moments_state(m: Mapping[str, np.ndarray], v: Mapping[str, np.ndarray], t: int) -> Arrays:
    """Adam's moments (``m.NAME``, ``v.NAME``) and step count ``t``, copied, as a checkpoint component."""
    arrays = {f"m.{k}": a.copy() for k, a in m.items()}
    arrays.update({f"v.{k}": a.copy() for k, a in v.items()})
    arrays["t"] = np.asarray(t, dtype=np.int64)
    return arrays


def moments_from(arrays: Mapping[str, np.ndarray], names: Iterable[str]) -> tuple[Arrays, Arrays, int]:
    """(m, v, t) of the parameters ``names`` back from :func:`moments_state`'s arrays."""
    names = list(names)
    m = {k: np.array(arrays[f"m.{k}"], dtype=np.float32) for k in names}
    v = {k: np.array(arrays[f"v.{k}"], dtype=np.float32) for k in names}
    return m, v, int(arrays["t"])


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

    def skip_batches(self, n: int) -> None:
        """Draw the next ``n`` batches of this rank's data and throw them away (nothing else moves:
        no random draw of the step, no optimizer state)."""

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
    #: what each option means, with its unit (the scenario schema and docs/parallel.md say it)
    option_docs: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: an estimate of what one rank's process holds in host memory, in bytes, from (options, layout),
    #: computed from the shapes alone (nothing allocated): a scenario that cannot fit is refused
    host_bytes: Callable[[Mapping[str, Any], Any], int] | None = None


def _a_workload(obj: Any) -> WorkloadInfo:
    if not isinstance(obj, WorkloadInfo):
        raise TestbedError(
            f"{obj!r} is not a workload: register a testbed.WorkloadInfo (name, description, factory, "
            "options)",
            value=repr(obj),
        )
    return obj


#: every workload by name: the testbed's (registered when :mod:`workloads` is imported), those other
#: installed packages declare under the entry-point group ``testbed.workloads``, and those a program
#: registers with :func:`register`
WORKLOADS: Registry[WorkloadInfo] = Registry("testbed.workloads", "workload", _a_workload)


def register(info: WorkloadInfo) -> WorkloadInfo:
    """Make the workload ``info`` describes usable in scenarios under ``info.name``."""
    registered: WorkloadInfo = WORKLOADS.register(getattr(info, "name", ""), info)
    return registered
