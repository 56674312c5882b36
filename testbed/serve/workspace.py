"""An instance's activation memory: where each forward pass places its workspace, and where a
fragmented device turns into latency jitter or a named out-of-memory.

Every iteration's forward pass needs a workspace in device memory: the
widest activation a token holds (:meth:`~testbed.serve.cost.Deployment.activation_bytes_per_token`)
for every token of the pass; a prompt longer than the prefill budget runs
in chunks of the budget, so the largest pass is the budget's prefill beside
a full decode batch. The workspace is placed by the testbed's caching
allocator (:mod:`testbed.fabric.device_memory`) and freed at the
iteration's end, in a memory of twice that peak (an assumption: the
profiled peak, as vLLM's profiling run measures it, and as much again of
headroom), which the profiling pass leaves reserved as one cached segment
(the rest of the device holds the weights and the KV cache, so no new
segment can be had). Unfragmented, a workspace always fits and costs
nothing.

A ``memory_fragment`` fault pins a pattern of blocks in this memory for a
while. A pass whose workspace then finds no free block large enough, though
the free total would hold it, is what the scenario's ``policy.memory``
says: ``defragment`` compacts the memory first (``bytes moved / HBM
bandwidth``), ``pool`` borrows the workspace from the supernode's memory
pool (``bytes / link bandwidth``: every pass that needs it pays again, so
the tail latency shows it), ``none`` fails the pass's prefills with the
allocator's :class:`~testbed.core.errors.DeviceOOM`, named with the request
and the largest free block.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.errors import DeviceOOM
from testbed.fabric.device_memory import SEGMENT_ROUND, Device, pin_pattern, round_up
from testbed.serve.colocation import Window

#: the workspace's tag in the allocator
TAG = "workspace"


@dataclass(frozen=True)
class MemoryPlan:
    """An instance's activation memory: its bytes, the policy on an allocation that does not fit,
    and the supernode pool it may borrow from (``pool_bytes`` at ``pool_Bps``)."""

    capacity: int
    per_token: int
    policy: str = "none"
    hbm_Bps: float = 1.6e12
    pool_bytes: int = 0
    pool_Bps: float = 1.0


def capacity_for(peak_tokens: int, per_token: int) -> int:
    """An activation memory of twice the largest pass's workspace (``peak_tokens`` tokens)."""
    return 2 * round_up(peak_tokens * per_token, SEGMENT_ROUND) + SEGMENT_ROUND


class Workspace:
    """One instance's activation memory, the pins of a fragmentation fault in force, and the
    workspace of the pass in progress."""

    def __init__(self, plan: MemoryPlan, rank: int = 0) -> None:
        self.plan = plan
        self.device = Device(plan.capacity, rank, plan.policy, plan.hbm_Bps, plan.pool_bytes, plan.pool_Bps)
        # the engine's profiling pass reserves all of it as one segment, which the allocator keeps
        self.device.free(self.device.alloc(plan.capacity, "profile"))
        self.pins: list[tuple[str, int]] = []
        self.placed: tuple[str, int] | None = None

    def pin(self, block: int, count: int, spacing: int) -> None:
        """Pin ``count`` blocks of ``block`` bytes with ``spacing``-byte holes after them (as many
        as fit)."""
        self.pins, _ = pin_pattern(self.device, "fragment", block, count, spacing)

    def unpin(self) -> None:
        """Free what :meth:`pin` pinned."""
        for placed in self.pins:
            self.device.free(placed)
        self.pins = []

    def place(self, tokens: int) -> None:
        """Place the workspace of a pass of ``tokens`` tokens (:class:`DeviceOOM` if the policy
        cannot); free it with :meth:`release`."""
        self.placed = self.device.alloc(max(1, tokens * self.plan.per_token), TAG)

    def release(self) -> None:
        """Free the workspace of the pass that ended."""
        if self.placed is not None:
            self.device.free(self.placed)
            self.placed = None

    def follow(self, window: Window | None) -> Window | None:
        """Pin the pattern of a fragmentation ``window`` in force, free it once none is; the window."""
        if window is not None and not self.pins:
            self.pin(*window.pin)
        elif window is None and self.pins:
            self.unpin()
        return window

    def place_pass(self, prefill: int, decodes: int) -> tuple[str, DeviceOOM | None]:
        """Place a pass of ``prefill`` prefilled and ``decodes`` decoded tokens: what fits (``all``,
        ``decode`` alone, or ``none``) and the out-of-memory that decided it."""
        oom = None
        for fits, tokens in (("all", prefill + decodes), ("decode", decodes)):
            if fits == "decode" and not prefill:
                break
            try:
                self.place(tokens)
                return fits, oom
            except DeviceOOM as err:
                oom = err
        return "none", oom

    def costs(self, faulted: bool, failed: int) -> dict[str, float]:
        """What the pass's placement cost since last asked: ``workspace_s`` (compaction and
        borrowing), ``fault_s`` (the same, while a fault is in force), the bytes borrowed and
        compacted, and how many requests it failed."""
        done, self.device.events = self.device.events, []
        seconds = self.device.charge()
        return {
            "workspace_s": seconds,
            "fault_s": seconds if faulted else 0.0,
            "borrowed_bytes": float(sum(_int(e, "bytes") for e in done if e["action"] == "borrow")),
            "compacted_bytes": float(
                sum(_int(e, "bytes_moved") for e in done if e["action"] == "defragment")
            ),
            "workspace_failed": float(failed),
        }


def _int(event: dict[str, object], key: str) -> int:
    value = event.get(key, 0)
    return value if isinstance(value, int) else 0
