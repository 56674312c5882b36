"""Checkpoints commit atomically, verify their checksums, and never unpickle."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from testbed import checkpoint as ckpt
from testbed.errors import CheckpointError


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
