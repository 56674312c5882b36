"""What a silent data corruption does to one rank's steps, and what the rank records of it.

An NPU holds one :class:`RankCorruption`. Each step run begins with
:meth:`RankCorruption.begin`, which reads the rank's ``sdc`` knob; the
step then hands it what the corruption may strike: the state at rest
(:meth:`strike_state`), each value the compute makes (:meth:`made`), the
local gradients (:meth:`strike_gradients`) and every payload received
(:meth:`payload`). What changed is kept per step run (:attr:`hits`), the
truth the journal records; which faults struck this process is kept for
good, so a transient corruption strikes a process once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from testbed.collectives.endpoint import Received
from testbed.core.errors import DeviceFault
from testbed.fabric.clock import RankClock
from testbed.train.corruption import CorruptionSpec, strike

#: where a corruption strikes, by what the step hands over
AT_REST = ("params", "optimizer")
MADE = ("activation", "index")


class Stateful(Protocol):
    """The part of a workload a corruption at rest reaches."""

    def state(self, component: str) -> dict[str, np.ndarray]:
        """The arrays of one component."""

    def load(self, component: str, arrays: dict[str, np.ndarray]) -> None:
        """Replace one component's arrays."""


class RankCorruption:
    """One rank's silent corruption, step run by step run."""

    def __init__(self, rank: int, clock: Callable[[], RankClock], hbm_Bps: float) -> None:
        """``clock``: the rank's virtual clock now (a reset gives the rank a new one)."""
        self.rank, self._clock, self.hbm_Bps = rank, clock, hbm_Bps
        self.hits: list[dict[str, Any]] = []  # what it changed this step run
        self.checksum_mismatches: list[dict[str, Any]] = []  # payloads a checksum caught this step run
        self.healthy_run = False  # a replay standing for another NPU: no corruption of this one
        self.payload_spec: CorruptionSpec | None = None  # of a link into this rank, until it struck
        self.made_spec: CorruptionSpec | None = None  # of a value the step makes, until its first
        self.checksums = False
        self._struck: set[str] = set()  # the faults that struck this process so far
        self._step, self._attempt = 0, 0

    def begin(self, knob: str, step: int, attempt: int, checksums: bool) -> CorruptionSpec | None:
        """A step run begins: the corruption in force (None: healthy, or run as on another NPU)."""
        spec = None if self.healthy_run else CorruptionSpec.from_knob(knob)
        self._step, self._attempt, self.checksums = step, attempt, checksums
        self.hits, self.checksum_mismatches = [], []
        self.payload_spec = spec if spec is not None and spec.where == "payload" else None
        self.made_spec = spec if spec is not None and spec.where in MADE else None
        return spec

    @property
    def watches_payloads(self) -> bool:
        """Whether :meth:`payload` must see every payload received this step run."""
        return self.payload_spec is not None or self.checksums

    def strike_state(self, spec: CorruptionSpec, workload: Stateful) -> None:
        """Corrupt the state at rest ``spec`` names, as the step begins."""
        arrays, hits = self._strike(spec, workload.state(spec.where))
        if hits:
            workload.load(spec.where, arrays)

    def strike_gradients(self, spec: CorruptionSpec, grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The local gradients, corrupted before the reduction."""
        return self._strike(spec, grads)[0]

    def made(self, kind: str, name: str, value: np.ndarray) -> np.ndarray:
        """A value the step made (a layer's output, a gradient handed back, the sample indices), with
        the corruption applied to the first of its kind, once per step run."""
        spec = self.made_spec
        if spec is None or kind != ("index" if spec.where == "index" else spec.during):
            return value
        self.made_spec = None
        return self._strike(spec, {name: value})[0][name]

    def payload(self, got: Received, arr: np.ndarray) -> np.ndarray:
        """A payload this rank received: its checksum checked (one read of it), and a corruption of its
        link applied, once per step run; with checksums, caught and sent again."""
        clock = self._clock()
        if self.checksums:
            clock.advance_to(clock.t + got.nbytes / self.hbm_Bps)
        spec = self.payload_spec
        if spec is None or got.src != spec.src or got.op != "allreduce" or arr.dtype.kind != "f":
            return arr
        if spec.half and got.half != spec.half:
            return arr
        name = f"payload {got.src}->{self.rank}"
        changed, hits = strike(spec, {name: arr}, self.rank, self._step, *self._history(spec))
        if not hits:
            return arr
        self.payload_spec = None
        if not self.checksums:
            self._record(hits)
            return changed[name]
        clock.advance_to(clock.t + got.transfer_s)  # the message is sent again
        self._record([{**h, "caught": True} for h in hits])
        self.checksum_mismatches.append({"src": got.src, "dst": self.rank, "half": got.half})
        return arr

    def device_fault(self, err: IndexError) -> Exception:
        """An index out of range in the step: a device fault when a corrupted index made it (the step
        fails, as an illegal address does on a device); otherwise the testbed's own bug, as it was."""
        made = [h for h in self.hits if h["where"] == "index"]
        if not made:
            return err
        first = made[0]
        return DeviceFault(
            f"rank {self.rank}: device fault at step {self._step}: the batch's gather of samples failed "
            f"({err}); index {first['before']} of {first['tensor']} had become {first['after']} (bits "
            f"{first['bits']} flipped): a silent corruption of an index crashed a later operation",
            rank=self.rank,
            op="gather",
            step=self._step,
            t=self._clock().t,
            wait_start=self._clock().t,
            how="direct",
            sdc=made,
        )

    def step_fields(self) -> dict[str, Any]:
        """What the step's result carries of it: the values changed, the payloads caught."""
        return {
            **({"sdc": self.hits} if self.hits else {}),
            **({"checksum_mismatch": self.checksum_mismatches} if self.checksum_mismatches else {}),
        }

    def _strike(
        self, spec: CorruptionSpec, arrays: dict[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
        out, hits = strike(spec, arrays, self.rank, self._step, *self._history(spec))
        self._record(hits)
        return out, hits

    def _record(self, hits: list[dict[str, Any]]) -> None:
        self.hits.extend(hits)
        self._struck.update(h["fault"] for h in hits)

    def _history(self, spec: CorruptionSpec) -> tuple[int, bool]:
        """(this step run's number, whether the corruption struck this process before)."""
        return self._attempt, spec.fault in self._struck
