"""Checkpoints commit atomically, verify their checksums, and never unpickle."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.core.errors import CheckpointError
from testbed.train import checkpoint as ckpt


def write(root: Path, step: int, value: float = 1.0) -> Path:
    tmp = ckpt.step_dir(root, step, tmp=True)
    entries = ckpt.write_shard(tmp, 0, {"params": {"w": np.full(4, value, dtype=np.float32)}})
    return ckpt.commit(root, step, {"step": step, "ranks": {"0": entries}})


def test_commit_renames_into_place_and_loads_back(tmp_path: Path) -> None:
    path = write(tmp_path, 10, value=2.0)
    assert path.name == "step_00000010" and not ckpt.step_dir(tmp_path, 10, tmp=True).exists()
    found, skipped = ckpt.newest(tmp_path)
    assert found is not None and found.step == 10 and skipped == []
    file, sha = found.files_of(0)["params"]
    np.testing.assert_array_equal(ckpt.read_component(file, sha)["w"], np.full(4, 2.0, dtype=np.float32))


def test_a_torn_write_is_never_loaded(tmp_path: Path) -> None:
    write(tmp_path, 10)
    ckpt.write_shard(ckpt.step_dir(tmp_path, 20, tmp=True), 0, {"params": {"w": np.zeros(4)}})  # no commit
    found, _ = ckpt.newest(tmp_path)
    assert found is not None and found.step == 10


def test_a_corrupt_shard_is_skipped_with_the_reason(tmp_path: Path) -> None:
    write(tmp_path, 10)
    newer = write(tmp_path, 20)
    shard = newer / "rank_00000" / "params.npz"
    data = bytearray(shard.read_bytes())
    data[-20] ^= 0xFF
    shard.write_bytes(bytes(data))
    found, skipped = ckpt.newest(tmp_path)
    assert found is not None and found.step == 10
    assert len(skipped) == 1 and "sha256" in skipped[0] and "step_00000020" in skipped[0]


def test_newest_before_a_step(tmp_path: Path) -> None:
    write(tmp_path, 10)
    write(tmp_path, 20)
    found, _ = ckpt.newest(tmp_path, before=20)
    assert found is not None and found.step == 10


def test_a_committed_checkpoint_is_never_overwritten(tmp_path: Path) -> None:
    write(tmp_path, 10)
    with pytest.raises(CheckpointError, match="never overwritten"):
        write(tmp_path, 10)


def test_object_arrays_are_refused_on_load(tmp_path: Path) -> None:
    path = tmp_path / "evil.npz"
    np.savez(path, x=np.array([{"a": 1}], dtype=object))
    sha = ckpt._sha256(path)
    with pytest.raises(CheckpointError, match="refused"):
        ckpt.read_component(str(path), sha)


def test_manifest_records_shapes_dtypes_and_hashes(tmp_path: Path) -> None:
    path = write(tmp_path, 10)
    manifest = json.loads((path / "manifest.json").read_text())
    entry = manifest["ranks"]["0"]["params"]
    assert entry["arrays"]["w"] == {"shape": [4], "dtype": "<f4"}
    assert len(entry["sha256"]) == 64


WRITER = Path(__file__).with_name("ckpt_writer.py")


def write_in_a_process(root: Path, step: int, seed: int, point: str, victim: int) -> int:
    """Run the writer; returns its exit code (-9 when it was SIGKILLed at ``point``)."""
    proc = subprocess.run(
        [sys.executable, str(WRITER), str(root), str(step), str(seed), point, str(victim)],
        capture_output=True,
        timeout=60,
    )
    return proc.returncode


@settings(max_examples=12, deadline=None)
@given(
    point=st.sampled_from(["shard.mid", "manifest.written", "renamed", "none"]),
    victim=st.integers(0, 1),
    flip=st.one_of(
        st.none(),
        st.tuples(st.integers(0, 1), st.sampled_from(["params", "optimizer"]), st.integers(0, 10**6)),
    ),
)
def test_torn_and_corrupt_checkpoints_are_never_loaded(
    tmp_path_factory: pytest.TempPathFactory, point: str, victim: int, flip: tuple[int, str, int] | None
) -> None:
    root = tmp_path_factory.mktemp("ck")
    assert write_in_a_process(root, 10, seed=1, point="none", victim=0) == 0
    code = write_in_a_process(root, 20, seed=2, point=point, victim=victim)
    assert code == (0 if point == "none" else -signal.SIGKILL)
    committed = point in ("renamed", "none")  # the rename is the commit
    if flip is not None and committed:
        rank, comp, where = flip
        shard = ckpt.step_dir(root, 20) / f"rank_{rank:05d}" / f"{comp}.npz"
        data = bytearray(shard.read_bytes())
        data[where % len(data)] ^= 0x40
        shard.write_bytes(bytes(data))
    found, skipped = ckpt.newest(root)
    assert found is not None
    intact = committed and flip is None
    assert found.step == (20 if intact else 10)
    assert bool(skipped) == (committed and flip is not None)  # a corrupt one is skipped with its reason
    for rank in (0, 1):  # what loads is exactly what was written
        for comp, (file, sha) in found.files_of(rank).items():
            got = ckpt.read_component(file, sha)
            want = writer_arrays(2 if intact else 1, rank)[comp]
            assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)


def writer_arrays(seed: int, rank: int) -> dict[str, dict[str, np.ndarray]]:
    from tests.ckpt_writer import arrays

    return arrays(seed, rank)


def test_prune_keeps_the_newest_k(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        write(tmp_path, step)
    assert ckpt.prune(tmp_path, 0) == []
    assert ckpt.prune(tmp_path, 2) == [10, 20]
    assert [s for s, _ in ckpt.committed(tmp_path)] == [30, 40]


def test_quarantine_moves_a_checkpoint_out_of_the_candidates(tmp_path: Path) -> None:
    write(tmp_path, 10)
    bad = write(tmp_path, 20)
    assert ckpt.quarantine(bad).name == "step_00000020.bad"
    write(tmp_path, 20)
    assert ckpt.quarantine(ckpt.step_dir(tmp_path, 20)).name == "step_00000020.bad2"
    assert [s for s, _ in ckpt.committed(tmp_path)] == [10]


def test_a_checkpoint_not_persisted_by_the_failure_is_moved_aside(tmp_path: Path) -> None:
    for step, done in ((10, 5.0), (20, 30.0)):
        tmp = ckpt.step_dir(tmp_path, step, tmp=True)
        entries = ckpt.write_shard(tmp, 0, {"params": {"w": np.ones(4, dtype=np.float32)}})
        ckpt.commit(tmp_path, step, {"step": step, "ranks": {"0": entries}, "t_persisted": done})
    found, skipped = ckpt.newest(tmp_path, persisted_by=29.0)
    assert found is not None and found.step == 10 and "never persisted" in skipped[0]
    assert (tmp_path / "step_00000020.unpersisted").is_dir()
    found, _ = ckpt.newest(tmp_path, persisted_by=100.0)
    assert found is not None and found.step == 10  # the moved one stays out
