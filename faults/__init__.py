"""Fault kinds, one module per family; importing this package registers them all."""

from faults import node

__all__ = ["node"]
