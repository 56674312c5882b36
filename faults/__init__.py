"""Fault kinds, one module per family; importing this package registers them all."""

from faults import data, device, link, memory, node, storage

__all__ = ["data", "device", "link", "memory", "node", "storage"]
