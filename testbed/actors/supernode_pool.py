"""Supernode actors kept between the runs of one Ray session, for the next run to take.

Starting a supernode costs a Ray worker process, its imports and an NPU host
(a fresh interpreter that imports numpy and the NPU program): about a second
of CPU each, most of a small run's start, paid again by every run of a test
session or a suite. A run on a Ray instance its caller keeps (a test
session's, a suite's) hands its supernode actors back here when it ends. Each
first ends everything of its run (:meth:`Supernode.recycle
<testbed.actors.supernode.Supernode.recycle>`): its NPU processes, spares and
cut-off processes are SIGKILLed and seen gone, its relay lines and their
threads closed; one that cannot promise that is ended instead. The next run
takes idle ones first and tells each to begin (new lines under the new run's
secret, nothing recorded); its NPU processes are forked afresh, as ever.

Only actors of the current Ray session and job are taken: a pool left from an
earlier Ray instance is dropped, never called. Runs placed on a multi-node
cluster (a placement group per run) do not use the pool.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

#: idle supernode actors kept at most (each holds a Ray worker and an NPU host: about 140 MiB of RSS)
MAX_IDLE = 8

#: wall seconds the end of a run waits for its supernodes to recycle (each waits 10 s at most)
RECYCLE_WAIT_S = 15.0

_idle: list[Any] = []
_lock = threading.Lock()  # runs may end on several threads (a suite's reference runs)
_session: tuple[str, str] | None = None  # (Ray node, job) the idle actors belong to


def _current() -> tuple[str, str]:
    import ray

    context = ray.get_runtime_context()
    return context.get_node_id(), context.get_job_id()


def idle() -> int:
    """How many idle supernode actors the current Ray session holds."""
    return len(_idle) if _session == _current() else 0


def end_idle() -> None:
    """End every idle actor of the current Ray session (a test's clean slate)."""
    import ray

    with _lock:
        ending = list(_idle) if _session == _current() else []
        _idle.clear()
    for actor in ending:
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)


def forget() -> None:
    """Drop every idle actor without calling it (its Ray instance is going or gone)."""
    global _session
    with _lock:
        _idle.clear()
        _session = None


def supernodes(
    count: int, begin: Callable[[Any, int], Any], new: Callable[[int], Any], guard_s: float
) -> list[Any]:
    """``count`` supernode actors for a run, by index: idle ones first, each started on its index
    with ``begin(actor, index)`` (a ref), new ones from ``new(index)`` for the rest and for any idle
    one that fails to begin."""
    import ray

    with _lock:
        taken = [_idle.pop() for _ in range(min(count, idle()))]
    begun = [begin(actor, i) for i, actor in enumerate(taken)]
    out = [*taken, *(new(i) for i in range(len(taken), count))]
    for i, ref in enumerate(begun):
        try:
            ray.get(ref, timeout=guard_s)
        except Exception:  # gone since it was kept: a new one instead
            with contextlib.suppress(Exception):
                ray.kill(taken[i], no_restart=True)
            out[i] = new(i)
    return out


def keep_or_end(actors: list[Any]) -> None:
    """End a run's supernode actors' runs; keep for the next run those that end it cleanly (up to
    :data:`MAX_IDLE`), and end the others (Ray kills the actor and its NPU host goes with it)."""
    global _session
    import ray

    refs = {}
    for actor in actors:
        with contextlib.suppress(Exception):
            refs[actor.recycle.remote()] = actor
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=RECYCLE_WAIT_S)
    clean = []
    for ref in ready:
        with contextlib.suppress(Exception):
            if ray.get(ref, timeout=0) is True:
                clean.append(refs[ref])
    with _lock:
        if _session != _current():
            _idle.clear()
            _session = _current()
        kept = clean[: max(0, MAX_IDLE - len(_idle))]
        _idle.extend(kept)
    for actor in actors:
        if not any(actor is k for k in kept):
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
