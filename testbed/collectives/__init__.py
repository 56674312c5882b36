"""Collectives over the data plane, with real numpy data and virtual time (:mod:`testbed.fabric.clock`).

:class:`Communicator` is the API; :class:`Endpoint` is a rank's attachment to
the fabric. Algorithms: ``ring``, ``mesh``, ``halving_doubling``,
``hierarchical``, ``pairwise`` (all-to-all); ``auto`` chooses
(:func:`testbed.collectives.select.choose`).
"""

from testbed.collectives.api import Communicator
from testbed.collectives.group import (
    DEFAULT_VERSION,
    HCCL_CONNECT_GRACE_S,
    Endpoint,
    Group,
    Modelled,
    abort_job,
)
from testbed.collectives.select import OFFERED, choose

__all__ = [
    "DEFAULT_VERSION",
    "HCCL_CONNECT_GRACE_S",
    "OFFERED",
    "Communicator",
    "Endpoint",
    "Group",
    "Modelled",
    "abort_job",
    "choose",
]
