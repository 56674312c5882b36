"""Supernode resilience testbed: rehearse training failures on Ray actors with modelled time."""

from testbed import loopback as _loopback  # noqa: F401  (must run before any `import ray`)

__version__ = "0.2.0"
