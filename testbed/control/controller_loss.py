"""The controller's own death, for real: a hosted controller process SIGKILLs itself at a point.

A ``controller_kill`` fault arms the kill (:class:`ArmedKill` in the run's
state); the controller reaches each point it can die at (the boundary
before a step, once the step's injections are journalled; a checkpoint's
commit, once its manifest is written and before the rename) and calls
:func:`die_if_armed`. Only a process that :mod:`testbed.control.hosted`
started for the purpose ever kills itself: anywhere else (a test session's
process, a user's program) the kill is refused with an error, never done.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Any

from testbed.core.errors import TestbedError
from testbed.core.journal import Journal

#: set, to its own pid, in the process hosting a run whose controller may be killed
HOSTED_ENV = "TESTBED_HOSTED_CONTROLLER"


@dataclass(frozen=True)
class ArmedKill:
    """A controller kill waiting for its point: the fault, the point, whether it tears the journal."""

    fault_id: str
    point: str
    torn: bool = False


def become_host() -> None:
    """Mark this process as hosting a run whose controller may be killed (a hosted child's first act)."""
    os.environ[HOSTED_ENV] = str(os.getpid())


def hosted() -> bool:
    """Whether this process hosts a run whose controller may be killed (and so may kill itself)."""
    return os.environ.get(HOSTED_ENV) == str(os.getpid())


def die_if_armed(armed: ArmedKill | None, journal: Journal, point: str, t: float, **where: Any) -> None:
    """SIGKILL this process if ``armed`` waits for ``point``, after journalling it (``t``: the virtual
    time, ``where``: the step or the checkpoint); with ``torn``, half an event line is left after it."""
    if armed is None or armed.point != point:
        return
    if not hosted():
        raise TestbedError(
            f"fault {armed.fault_id} would SIGKILL this process, which does not host the run for it; "
            "run the scenario with testbed run or testbed.run, which host it in a process of its own",
            fault=armed.fault_id,
        )
    journal.emit(
        "controller_killed", phase="main", fault=armed.fault_id, point=point, t=t, pid=os.getpid(), **where
    )
    if armed.torn:
        journal.tear()
    os.kill(os.getpid(), signal.SIGKILL)


class KillPoints:
    """Lets a controller be killed at a point of a recovery (the controller mixes it in)."""

    state: Any
    journal: Journal

    def reached(self, point: str) -> None:
        """The controller reached ``point`` of a recovery: a controller kill armed for it comes now."""
        clocks = self.state.clock_of.values()  # the group is ready when its last rank is
        die_if_armed(self.state.controller_kill, self.journal, point, max(clocks, default=0.0))
