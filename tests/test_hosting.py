"""NPU processes forked by their supernode's NPU host: real processes, seen to die, frozen, and ended.

Each test starts one small cluster (one supernode of three NPUs) on the
session's Ray and acts on its processes for real: a SIGKILL from outside the
testbed, a SIGSTOP by the supernode, the end of the cluster.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection, Pipe
from pathlib import Path

import psutil
import pytest

from testbed.actors.cluster import Cluster
from testbed.actors.npu_line import NPULine
from testbed.actors.outcome import is_death
from testbed.actors.rank_signals import process_gone
from testbed.actors.shared_storage import MARKER, read_marker, refuse_unless_shared, write_marker
from testbed.control.runner import rank_spec
from testbed.core.errors import ProcessDied, RankHung, ScenarioError
from testbed.scenario.parse import parse_scenario

SMALL = """\
version: 1
name: hosting
cluster: {supernodes: 1, npus_per_supernode: 3}
workload: {steps: 2, parallel: {dp: 3}}
"""


@pytest.fixture
def cluster(ray_session: object) -> Iterator[Cluster]:
    c = Cluster(rank_spec(parse_scenario(SMALL)), guard_s=30.0)
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.mark.ray
def test_npus_are_forked_processes_of_the_npu_host_and_none_outlives_the_cluster(ray_session: object) -> None:
    c = Cluster(rank_spec(parse_scenario(SMALL)), guard_s=30.0)
    try:
        c.start()
        pids = set(c.pids.values())
        hosts = {psutil.Process(p).ppid() for p in pids}
        assert len(pids) == 3 and len(hosts) == 1  # one NPU host forked all three
        (host,) = hosts
        assert "testbed.actors.npu_host" in psutil.Process(host).cmdline()
        assert all("ray::" not in " ".join(psutil.Process(p).cmdline()) for p in pids)  # not Ray workers
        everything = set(c.all_pids()) | {host}
    finally:
        c.stop()
    deadline = time.monotonic() + 15.0  # Ray ends a killed actor's worker process asynchronously
    while time.monotonic() < deadline and not all(process_gone(p) for p in everything):
        time.sleep(0.1)
    assert [p for p in everything if not process_gone(p)] == []


@pytest.mark.ray
def test_a_process_killed_outside_the_plan_is_seen_dead_with_no_death_record(cluster: Cluster) -> None:
    os.kill(cluster.pids[1], signal.SIGKILL)  # not the supernode's doing: the OOM killer, say
    out = cluster.call("info")
    assert out[0].ok and out[2].ok
    assert isinstance(out[1].error, ProcessDied) and is_death(out[1].error)
    assert "the process of rank 1" in str(out[1].error)
    assert cluster.deaths() == []  # no fault killed it: the recovery refuses to call it planned


@pytest.mark.ray
def test_a_kill_by_the_supernode_is_recorded_and_a_replacement_answers(cluster: Cluster) -> None:
    old = cluster.pids[2]
    record = cluster.kill(2, 1.5, 4, "boundary")
    assert record["gone"] is True and process_gone(old)
    (death,) = cluster.deaths(expected=[2])
    assert (death["rank"], death["t"], death["step"], death["point"]) == (2, 1.5, 4, "boundary")
    new = cluster.replace(2)
    assert new != old and cluster.call_ok("info")[2]["pid"] == new


@pytest.mark.ray
def test_a_frozen_npu_is_answered_as_hung_while_the_others_answer(cluster: Cluster) -> None:
    import ray

    sup = cluster.supervisors[0]
    ray.get(sup.freeze.remote(0, 2.0, 3, "allreduce.mid"), timeout=30)
    frozen, deadline = psutil.Process(cluster.pids[0]), time.monotonic() + 10
    while frozen.status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
        time.sleep(0.01)  # SIGSTOP is delivered asynchronously: a busy machine shows it a moment later
    assert frozen.status() == psutil.STATUS_STOPPED
    out = cluster.call("info")
    assert out[1].ok and out[2].ok
    assert isinstance(out[0].error, RankHung) and out[0].error.fields["point"] == "allreduce.mid"
    cluster.kill(0, 2.0, 3, "hang")  # a frozen process is killed as any other
    assert process_gone(cluster.pids[0])


def test_storage_that_a_supernode_does_not_see_is_refused_naming_it_and_the_fix(tmp_path: Path) -> None:
    token = write_marker(str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt" / MARKER).read_text() == token == read_marker(str(tmp_path / "ckpt"))
    refuse_unless_shared("s", token, {0: (token, "127.0.0.2"), 1: (token, "127.0.0.3")})  # shared: fine
    with pytest.raises(ScenarioError) as err:
        refuse_unless_shared("s", token, {0: (token, "127.0.0.2"), 1: (None, "127.0.0.3")})
    text = str(err.value)
    assert "storage s is not shared: supernode 1 on the Ray node at 127.0.0.3" in text
    assert "1 of 2 supernodes" in text and "every node mounts" in text
    assert read_marker(str(tmp_path / "elsewhere")) is None


def test_storage_that_cannot_be_written_is_refused_before_anything_starts(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ScenarioError, match="cannot write there"):
        write_marker(str(tmp_path / "file" / "ckpt"))


def _line() -> tuple[NPULine, Connection]:
    mine, theirs = Pipe()
    return NPULine(mine, pid=0, rank=5), theirs


def _drain(conn: Connection) -> list[object]:
    got = []
    while conn.poll(0.2):
        got.append(conn.recv())
    return got


def test_markers_for_an_idle_npu_wait_for_its_next_call_that_may_wait_on_a_peer() -> None:
    child, npu = _line()
    cond = threading.Condition()
    abort = (7, 2, 1, {"tag": "*1"})
    child.tell(cond, dead=(3, None))
    child.tell(cond, markers=[abort])
    assert _drain(npu) == []  # idle: nothing wakes it
    child.send_call(cond, ("call", 1, "reset", (0.0,)))  # a call that never waits on a peer
    assert _drain(npu) == [("call", 1, "reset", (0.0,))]
    child.busy = 0
    child.send_call(cond, ("call", 2, "train_step", (9, 0.0)))
    assert _drain(npu) == [("mark_dead", 3, None), ("deliver", [abort]), ("call", 2, "train_step", (9, 0.0))]
    child.tell(cond, markers=[abort])  # a call in flight: at once
    assert _drain(npu) == [("deliver", [abort])]


def test_opening_an_epoch_drops_what_an_idle_npu_was_kept_of_older_epochs() -> None:
    child, npu = _line()
    cond = threading.Condition()
    old, new = (7, 2, 1, {"tag": "*1"}), (8, 3, 1, {"tag": "*1"})
    child.tell(cond, dead=(3, None))
    child.tell(cond, markers=[old, new])
    child.send_call(cond, ("call", 1, "open_group", (3, {}, 0.0, None)))
    assert _drain(npu) == [("deliver", [new]), ("call", 1, "open_group", (3, {}, 0.0, None))]
    assert child.pending_dead == [] and child.pending_markers == []
