"""Fault kinds, one module per family; importing this package registers them all."""

from faults import data, device, integrity, link, memory, node, preemption, storage

__all__ = ["data", "device", "integrity", "link", "memory", "node", "preemption", "storage"]
