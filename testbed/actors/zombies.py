"""A supernode's processes that were cut off from the controller, replaced, and left running.

A mixin of :class:`testbed.actors.supernode.Supernode`. When a partition
keeps the controller from reaching some ranks, it declares them lost and
starts new processes for them, but cannot end the old ones: a supernode
detaches each (its rank now belongs to the new process) and keeps it
running, a zombie, until the partition heals. Then the controller, which
reaches it again, has it do what it would do (:meth:`zombie_call`) and ends
it (:meth:`end_zombie`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from testbed.actors.npu_line import NPULine
from testbed.core.errors import HarnessHang


class ZombieKeeper:
    """Detach a rank's process, call it, end it."""

    children: dict[int, NPULine]
    deaths: list[dict[str, Any]]
    guard_s: float
    _cond: threading.Condition
    _ids: itertools.count[int]
    _record: Callable[[int, float, int, str], dict[str, Any]]  # the supernode's: who, when, where

    @property
    def zombies(self) -> dict[int, NPULine]:
        """Rank -> its detached process, still running."""
        return self.__dict__.setdefault("_zombies", {})

    def detach(self, rank: int, t_virtual: float, step: int) -> dict[str, Any]:
        """Give up ``rank``'s process (it runs on; the controller cannot reach it) and record it as
        lost, as a death is (``gone: false``), so that a new process may take the rank."""
        record = {**self._record(rank, t_virtual, step, "partition"), "gone": False}
        with self._cond:
            self.zombies[rank] = self.children.pop(rank)
            self.deaths.append(record)
        return record

    def zombie_call(self, rank: int, method: str, args: tuple[Any, ...]) -> tuple[bool, Any]:
        """Call ``method`` on ``rank``'s detached process; (ok, its value or error)."""
        child, call_id = self.zombies[rank], next(self._ids)
        child.send_call(self._cond, ("call", call_id, method, args))
        deadline = time.monotonic() + self.guard_s
        with self._cond:
            while call_id not in child.results and not child.dead and time.monotonic() < deadline:
                self._cond.wait(min(1.0, max(0.0, deadline - time.monotonic())))
            answer = child.results.pop(call_id, None)
        if answer is None:
            raise HarnessHang(f"the cut-off process of rank {rank} did not answer {method}", rank=rank)
        _, ok, value = pickle.loads(answer)
        return bool(ok), value

    def end_zombie(self, rank: int) -> int:
        """SIGKILL ``rank``'s detached process (the controller reaches it again); its pid."""
        child = self.zombies.pop(rank)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)
        return child.pid
