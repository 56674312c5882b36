"""Fault kinds, one module per family; importing this package registers them all."""

from faults import device, link, memory, node, storage

__all__ = ["device", "link", "memory", "node", "storage"]
