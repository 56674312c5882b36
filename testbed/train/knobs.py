"""The fault knobs an NPU exposes: what a fault kind may set on a rank, by name.

A knob is a value the rank's program reads as it runs (its compute slowdown,
the delay of its input, whether its storage is full, the operators its device
lacks). A fault kind sets one through its injector
(``injector.set_knob(ranks, "slowdown", 3.0)``) and sets it back when it heals;
a new process starts with every knob at its healthy value. A new fault that
acts inside the rank adds its knob here and reads it where it acts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from testbed.core.errors import TestbedError


@dataclass
class Knobs:
    """One rank's knobs, each at its healthy value until a fault sets it."""

    #: compute takes this many times as long (``straggler``)
    slowdown: float = 1.0
    #: each step waits this long for its input, in virtual seconds (``data_stall``)
    data_delay_s: float = 0.0
    #: checkpoint writes fail with ENOSPC (``storage_full``)
    storage_full: bool = False
    #: a shard's write fails at a point with an errno (``storage_full`` with ``point``/``errno``):
    #: ``POINT:ERRNO``, empty when the disk has room
    disk_full: str = ""
    #: operators the device lacks (``unsupported_op``)
    missing_ops: frozenset[str] = field(default_factory=frozenset)
    #: a silent data corruption it suffers (``sdc_gradient``, ``sdc_params``): a
    #: :class:`~testbed.train.corruption.CorruptionSpec` as its knob text, empty when healthy
    sdc: str = ""

    def set(self, name: str, value: Any) -> None:
        """Set the knob ``name`` (a knob of a list value takes any iterable)."""
        known = {f.name: f for f in dataclasses.fields(self)}
        if name not in known:
            raise TestbedError(
                f"an NPU has no fault knob '{name}'; its knobs are {', '.join(known)} (add a new one to "
                "testbed.train.knobs)",
                knob=name,
            )
        current = getattr(self, name)
        setattr(self, name, frozenset(value) if isinstance(current, frozenset) else type(current)(value))
