"""Supernode actors kept between runs of one Ray session: taken again, with nothing of a run left.

Each Ray test starts a cluster of two supernodes of two NPUs on the
session's Ray, acts on it (a kill, a spare, a frozen NPU, a dead NPU host),
ends it into the pool and starts the next: the same actors must come back
with fresh NPU processes, nothing recorded, new lines under the new run's
secret, and the last run's lines closed.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from testbed.actors import supernode_pool
from testbed.actors.cluster import Cluster
from testbed.actors.rank_signals import process_gone
from testbed.actors.supernode import Supernode
from testbed.control.runner import rank_spec
from testbed.core.errors import TestbedError
from testbed.scenario.parse import parse_scenario

TWO = """\
version: 1
name: pooled
cluster: {supernodes: 2, npus_per_supernode: 2}
workload: {steps: 2, parallel: {dp: 4}}
"""


def _cluster() -> Cluster:
    c = Cluster(rank_spec(parse_scenario(TWO)), guard_s=30.0, pooled=True)
    c.start()
    return c


def _actor_pids(c: Cluster) -> list[int]:
    import ray

    return [int(ray.get(sup.pid.remote(), timeout=30)) for sup in c.supervisors]


def _npu_host(actor_pid: int) -> psutil.Process:
    (host,) = [p for p in psutil.Process(actor_pid).children() if "npu_host" in " ".join(p.cmdline())]
    return host


def _wait_gone(pids: list[int], leaving: int = 0) -> list[int]:
    """Those of ``pids`` still running once all but ``leaving`` are gone (or 15 s have passed)."""
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline and sum(not process_gone(p) for p in pids) > leaving:
        time.sleep(0.05)
    return [p for p in pids if not process_gone(p)]


@pytest.fixture
def empty_pool(ray_session: object) -> Iterator[None]:
    """Start from no idle supernode (other tests of this session may have left some), end with none."""
    supernode_pool.end_idle()
    yield
    supernode_pool.end_idle()


@pytest.mark.ray
def test_the_next_run_takes_the_same_actors_with_fresh_npus_and_nothing_of_the_last_run(
    empty_pool: None,
) -> None:
    first = _cluster()
    try:
        actors, npus = _actor_pids(first), dict(first.pids)
        lines = _line_addresses(first)
        first.start_spares(1)
        first.kill(1, 1.0, 2, "boundary")  # a death the next run must not hear of
        first.detach(2, 1.5, 3)  # a cut-off process, still running
        first.notices()
    finally:
        first.stop()
    assert supernode_pool.idle() == 2
    assert not os.path.exists(first.socket_dir)
    for actor in actors:  # idle: its NPU host forks nothing until the next run
        assert _npu_host(actor).children() == []
    for host, port, _ in lines:  # the last run's relay lines listen no more
        with pytest.raises(OSError), socket.create_connection((host, port), timeout=2.0):
            pass
    assert _wait_gone(list(npus.values())) == []

    second = _cluster()
    try:
        assert sorted(_actor_pids(second)) == sorted(actors)
        assert supernode_pool.idle() == 0
        assert set(second.pids.values()).isdisjoint(npus.values())
        assert second.spec.secret != first.spec.secret
        assert second.deaths() == [] and second.notices() == [] and second.refusals() == []
        assert sorted(second.call_ok("info")) == [0, 1, 2, 3]
        assert all(len(second._get(s.pids.remote())) == 2 for s in second.supervisors)  # no spare left
    finally:
        second.stop()


def _line_addresses(c: Cluster) -> list[tuple[str, int, str]]:
    return [c._get(sup.line_address.remote()) for sup in c.supervisors]


@pytest.mark.ray
def test_a_supernode_whose_npu_host_died_is_ended_not_kept(empty_pool: None) -> None:
    c = _cluster()
    try:
        actors = _actor_pids(c)
        os.kill(_npu_host(actors[0]).pid, signal.SIGKILL)  # its NPUs are orphans the supernode ends
    finally:
        c.stop()
    assert supernode_pool.idle() == 1
    assert _wait_gone([actors[0]]) == [] and not process_gone(actors[1])
    again = _cluster()
    try:
        taken = _actor_pids(again)
        assert actors[1] in taken and actors[0] not in taken  # the kept one, and a new one
    finally:
        again.stop()


@pytest.mark.ray
def test_no_more_than_max_idle_are_kept_and_a_frozen_npu_does_not_stop_the_keeping(
    empty_pool: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray

    monkeypatch.setattr(supernode_pool, "MAX_IDLE", 1)
    c = _cluster()
    try:
        actors = _actor_pids(c)
        ray.get(c.supervisors[1].freeze.remote(2, 0.0, 0, "boundary"), timeout=30)
    finally:
        c.stop()
    assert supernode_pool.idle() == 1
    assert len(_wait_gone(actors, leaving=1)) == 1  # one ended, one kept
    assert _wait_gone(list(c.pids.values())) == []  # the frozen NPU too


@pytest.mark.ray
def test_actors_of_another_ray_session_are_never_taken(
    empty_pool: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = _cluster()
    c.stop()
    assert supernode_pool.idle() == 2
    monkeypatch.setattr(supernode_pool, "_current", lambda: ("another node", "another job"))
    assert supernode_pool.idle() == 0
    made: list[int] = []
    out = supernode_pool.supernodes(2, lambda a, i: pytest.fail("an old actor was called"), made.append, 5)
    assert made == [0, 1] and out == [None, None]
    monkeypatch.undo()
    assert supernode_pool.idle() == 2  # still there, for their own session


def _supernode_here(socket_dir: Path) -> tuple[Supernode, Any]:
    """A supernode in this process (not a Ray actor), with one stand-in NPU that records what it is told."""
    spec = dataclasses.replace(rank_spec(parse_scenario(TWO)), socket_dir=str(socket_dir))
    sup = Supernode(0, [0, 1], spec)

    class Told:
        rank, dead = 1, False

        def __init__(self) -> None:
            self.got: list[Any] = []

        def tell(self, cond: Any, dead: Any = None, markers: Any = None) -> None:
            self.got.append(dead or markers)

    npu = Told()
    sup.children = {1: npu}  # type: ignore[dict-item]
    return sup, npu


def test_word_of_an_earlier_run_is_not_taken_for_this_one(tmp_path: Path) -> None:
    sup, npu = _supernode_here(tmp_path)
    try:
        marker = (0, 1, 1, {"tag": "t"}, [1])
        sup.mark_dead(0, None, "/tmp/tb-sock-an-earlier-run")
        sup.deliver([marker], "/tmp/tb-sock-an-earlier-run")
        assert npu.got == []
        sup.mark_dead(0, None, sup.run_id)
        sup.deliver([marker], sup.run_id)
        sup.mark_dead(0)  # from this supernode itself: always this run's
        assert npu.got == [(0, None), [(0, 1, 1, {"tag": "t"})], (0, None)]
    finally:
        sup.children = {}
        sup.shutdown()


def test_a_run_that_ends_while_its_npus_start_leaves_none_for_the_next() -> None:
    short = Path(tempfile.mkdtemp(prefix="tb-", dir="/tmp"))  # unix socket paths stay under 108 bytes
    sup, _ = _supernode_here(short / "one")
    try:
        sup.children = {}
        (first,) = sup.spawn([0])
        assert sup.recycle() is True  # its socket ended: SIGKILLed, it may take a moment to be reaped
        assert _wait_gone([first["pid"]]) == []
        with pytest.raises(TestbedError, match="its run is ending"):  # a fork that came too late
            sup.spawn([1])
        spec = dataclasses.replace(rank_spec(parse_scenario(TWO)), socket_dir=str(short / "two"))
        sup.begin(0, [0, 1], spec)
        again = sup.spawn([0, 1])
        assert {i["rank"] for i in again} == {0, 1} and first["pid"] not in {i["pid"] for i in again}
        assert sup.recycle() is True and _wait_gone([i["pid"] for i in again]) == []
    finally:
        sup.shutdown()
        shutil.rmtree(short, ignore_errors=True)
