"""Fault kinds, one module per family; importing this package registers them all."""

from faults import link, memory, node

__all__ = ["link", "memory", "node"]
