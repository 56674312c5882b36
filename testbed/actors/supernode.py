"""The supervising actor of one supernode: it knows its NPUs' processes and kills them.

It plays the node agent: the fault injector asks it to SIGKILL a local NPU
process (a real kill, from another process), and it records each death with
the virtual time the NPU reported, so detection can be modelled exactly.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

import psutil


def process_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent, or a zombie waiting to be reaped)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


class Supernode:
    """Supervisor of the NPUs of one supernode."""

    def __init__(self, index: int, ranks: list[int]) -> None:
        self.index = index
        self.ranks = list(ranks)
        self.pids: dict[int, int] = {}
        self.deaths: list[dict[str, Any]] = []
        self.hangs: list[dict[str, Any]] = []

    def register(self, rank: int, pid: int) -> None:
        """Record the process of ``rank`` (at start and after a replacement)."""
        self.pids[rank] = pid

    def kill(self, rank: int, t_virtual: float, step: int, point: str) -> dict[str, Any]:
        """SIGKILL the process of ``rank`` (frozen or not) and wait (at most 10 s) until it is gone."""
        pid = self.pids[rank]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10.0
        while not process_gone(pid) and time.monotonic() < deadline:
            time.sleep(0.005)
        record = {**self._record(rank, t_virtual, step, point), "gone": process_gone(pid)}
        self.deaths.append(record)
        return record

    def freeze(self, rank: int, t_virtual: float, step: int, point: str) -> dict[str, Any]:
        """SIGSTOP the process of ``rank``: it lives but answers nothing (a hang)."""
        record = self._record(rank, t_virtual, step, point)
        self.hangs.append(record)
        os.kill(record["pid"], signal.SIGSTOP)
        return record

    def _record(self, rank: int, t_virtual: float, step: int, point: str) -> dict[str, Any]:
        """What a kill or a freeze journals: whose process, when (virtual) and where in the step."""
        return {
            "rank": rank,
            "pid": self.pids[rank],
            "supernode": self.index,
            "t": t_virtual,
            "step": step,
            "point": point,
        }

    def take_hangs(self) -> list[dict[str, Any]]:
        """Freezes recorded since the last call."""
        out, self.hangs = self.hangs, []
        return out

    def take_deaths(self) -> list[dict[str, Any]]:
        """Deaths recorded since the last call."""
        out, self.deaths = self.deaths, []
        return out

    def pid(self) -> int:
        """This supervisor's own process id."""
        return os.getpid()

    def node(self) -> str:
        """The Ray node this supervisor runs on."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

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
