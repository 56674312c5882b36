"""Fault kinds, one module per family; importing this package registers them all."""

from faults import (
    control_plane,
    data,
    device,
    integrity,
    link,
    memory,
    netem,
    node,
    partition,
    preemption,
    storage,
)

__all__ = [
    "control_plane",
    "data",
    "device",
    "integrity",
    "link",
    "memory",
    "netem",
    "node",
    "partition",
    "preemption",
    "storage",
]
