"""The real signals a supernode sends when a fault asks: a kill, a freeze, a notice, a lost Ray node.

A mixin of :class:`testbed.actors.supernode.Supernode`. Each is sent from
another process (the supernode), as a node agent or the kernel would, and
each is recorded with the virtual time and the point of the step the NPU
reported, so that detection can be modelled exactly.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any

import psutil

from testbed.actors.npu_line import NPULine
from testbed.core.errors import RankHung


def process_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent, or a zombie waiting to be reaped)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


class RankSignals:
    """SIGKILL, SIGSTOP and SIGTERM a rank's process, each recorded."""

    index: int
    children: dict[int, NPULine]
    deaths: list[dict[str, Any]]
    notices: list[dict[str, Any]]
    _cond: threading.Condition

    def kill(self, rank: int, t_virtual: float, step: int, point: str) -> dict[str, Any]:
        """SIGKILL the process of ``rank`` (frozen or not) and wait (at most 10 s) until it is gone."""
        pid = self.children[rank].pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10.0
        while not process_gone(pid) and time.monotonic() < deadline:
            time.sleep(0.002)
        record = {**self._record(rank, t_virtual, step, point), "gone": process_gone(pid)}
        with self._cond:
            self.deaths.append(record)
        return record

    def freeze(self, rank: int, t_virtual: float, step: int, point: str) -> dict[str, Any]:
        """SIGSTOP the process of ``rank``: it lives but answers nothing (a hang)."""
        record = self._record(rank, t_virtual, step, point)
        os.kill(record["pid"], signal.SIGSTOP)
        with self._cond:
            self.children[rank].frozen = record
            self._cond.notify_all()
        return record

    def terminate(self, rank: int, t_virtual: float, step: int, point: str) -> dict[str, Any]:
        """SIGTERM the process of ``rank``: a preemption's notice (its handler runs; it lives on)."""
        record = self._record(rank, t_virtual, step, point)
        with self._cond:  # recorded before it is sent: once its handler ran, the controller sees it
            self.notices.append(record)
        os.kill(record["pid"], signal.SIGTERM)
        return record

    def _record(self, rank: int, t_virtual: float, step: int, point: str) -> dict[str, Any]:
        """What a kill or a freeze journals: whose process, when (virtual) and where in the step."""
        return {
            "rank": rank,
            "pid": self.children[rank].pid,
            "supernode": self.index,
            "t": t_virtual,
            "step": step,
            "point": point,
        }

    def lose_node(self) -> int:
        """Lose this whole Ray node, as a power cut would: SIGKILL every process of the node's raylet
        (this worker's parent), the raylet, and last this supervisor. Returns only if it could not."""
        me = psutil.Process(os.getpid())
        raylet = me.parent()
        if raylet is None or "raylet" not in raylet.name():
            raise RuntimeError(f"supernode {self.index}: this worker's parent is not a raylet")
        for proc in raylet.children(recursive=True):
            if proc.pid != me.pid:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()
        raylet.kill()
        os.kill(me.pid, signal.SIGKILL)
        return int(raylet.pid)


def hung(record: dict[str, Any]) -> RankHung:
    """The error a call on a frozen rank answers."""
    message = f"rank {record['rank']} froze at {record['point']} of step {record['step']}; it answers nothing"
    return RankHung(message, **record)
