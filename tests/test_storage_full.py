"""A full disk or a quota at every point of a save, enumerated (not sampled): the save fails named,
nothing torn is ever loaded, and the newest committed checkpoint still loads, equal to its step."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from testbed.core.errors import CheckpointError
from testbed.train import checkpoint as ckpt

RANKS = (0, 1)


def state(step: int, rank: int) -> dict[str, dict[str, np.ndarray]]:
    """What rank ``rank`` saves at ``step``: values that name both."""
    base = np.arange(64, dtype=np.float32) + 1000 * step + rank
    return {"params": {"w": base}, "optimizer": {"m.w": base / 2, "t": np.asarray(step)}}


def save(root: Path, step: int, disk: ckpt.Disk = lambda point: None) -> Path:
    """Every rank's shard, then the commit, as the controller does."""
    tmp = ckpt.step_dir(root, step, tmp=True)
    tmp.mkdir(parents=True, exist_ok=True)
    ranks = {str(r): ckpt.write_shard(tmp, r, state(step, r), disk=disk) for r in RANKS}
    return ckpt.commit(root, step, {"step": step, "world": len(RANKS), "ranks": ranks}, disk=disk)


def points() -> list[str]:
    """Every filesystem operation of a save, in order, as a recording disk sees them."""
    seen: list[str] = []
    with tempfile.TemporaryDirectory() as root:
        save(Path(root), 8, seen.append)
    return seen


POINTS = points()


def test_the_save_has_a_point_for_every_write_fsync_and_the_commit() -> None:
    assert POINTS[-2:] == ["rename", "root fsync"]
    for r in RANKS:
        shard = [p for p in POINTS if p.startswith(f"rank_{r:05d}")]
        assert shard[0] == f"rank_{r:05d} mkdir" and shard[-1] == f"rank_{r:05d} fsync"
        assert any(p.startswith(f"rank_{r:05d}/params.npz write@") and not p.endswith("@0") for p in shard)
    assert {"manifest.json create", "manifest.json write@0", "manifest.json fsync", "dir fsync"} <= set(
        POINTS
    )
    assert len(POINTS) == len(set(POINTS))


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT], ids=["ENOSPC", "EDQUOT"])
@pytest.mark.parametrize("point", POINTS)
def test_a_full_disk_at_each_point_fails_the_save_and_keeps_the_last_good_checkpoint(
    tmp_path: Path, point: str, code: int
) -> None:
    save(tmp_path, 4)  # the last good checkpoint

    def full(at: str) -> None:
        if at == point:
            raise OSError(code, os.strerror(code), at)

    with pytest.raises(CheckpointError) as err:
        save(tmp_path, 8, full)
    assert err.value.fields["errno"] == code and os.strerror(code) in str(err.value)
    assert [s for s, _ in ckpt.committed(tmp_path)] == [4]  # step 8 is not committed
    found, skipped = ckpt.newest(tmp_path)
    assert found is not None and found.step == 4 and skipped == []
    for r in RANKS:  # the newest committed checkpoint loads, equal to what step 4 saved
        loaded = {c: ckpt.read_component(f, sha) for c, (f, sha) in found.files_of(r).items()}
        for c, arrays in state(4, r).items():
            assert all(np.array_equal(loaded[c][k], v) for k, v in arrays.items())
    assert ckpt.prune(tmp_path, keep=1) == []  # retention keeps the last good one: nothing to remove
    assert ckpt.step_dir(tmp_path, 8, tmp=True).exists()  # torn, left aside, never loaded
    # space again: the same step is written and committed over what the failure left
    shutil.rmtree(ckpt.step_dir(tmp_path, 8, tmp=True))
    save(tmp_path, 8)
    assert ckpt.newest(tmp_path)[0].step == 8  # type: ignore[union-attr]


# --- in a run: the job trains on, every rank fails the save together, the resume loads the last good one
@pytest.mark.ray
@pytest.mark.parametrize(
    ("point", "code"), [("commit_fsync", "ENOSPC"), ("shard_mid", "EDQUOT")], ids=["commit", "shard-mid"]
)
def test_a_full_disk_in_a_run_fails_that_save_for_every_rank_and_the_resume_loads_the_last_good_one(
    testbed_runs: Any, point: str, code: str
) -> None:
    from testbed.core.journal import read_journal
    from testbed.scenario.parse import parse_scenario
    from tests.conftest import SCENARIOS

    text = (SCENARIOS / "storage_full_at_commit.yaml").read_text()
    text = text.replace("point: commit_fsync}", f"point: {point}, errno: {code}}}")
    report = testbed_runs(parse_scenario(text, "full.yaml"))
    assert report.verdict == "pass", report.data["checks"]
    events = read_journal(report.out_dir / "journal.jsonl")
    (failed,) = [e for e in events if e["event"] == "checkpoint_failed"]
    assert failed["step"] == 8 and os.strerror(getattr(errno, code)) in str(failed["errors"])
    if point == "shard_mid":  # every rank's shard failed, none was committed: they failed together
        assert sorted(failed["errors"]) == ["0", "1", "2", "3"] and failed["written"] == []
    else:
        assert list(failed["errors"]) == ["commit"] and failed["written"] == [0, 1, 2, 3]
    (resume,) = [e for e in events if e["event"] == "resume" and e["phase"] == "main"]
    assert resume["from_step"] == 4  # the newest committed checkpoint, not the torn one
    effects = next(e for e in events if e["event"] == "fault_effects")["effects"]
    assert effects["f0-storage_full"]["how"] == f"checkpoint(s) 8 failed with {code}"


@pytest.mark.parametrize(
    ("field", "needle"),
    [
        ("point: disk", "point 'disk': choose from shard, shard_mid, manifest, rename, commit_fsync"),
        ("errno: EIO", "errno 'EIO': choose ENOSPC or EDQUOT"),
    ],
    ids=["point", "errno"],
)
def test_a_bad_point_or_errno_is_refused_with_the_choices(field: str, needle: str) -> None:
    from testbed.core.errors import ScenarioError
    from testbed.scenario.parse import parse_scenario
    from tests.conftest import SCENARIOS

    text = (SCENARIOS / "storage_full_at_commit.yaml").read_text().replace("point: commit_fsync", field)
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text, "s.yaml")
    assert needle in str(err.value), str(err.value)


@pytest.mark.ray
def test_one_ranks_quota_fails_that_save_for_every_rank_and_nothing_of_it_is_loaded(
    testbed_runs: Any,
) -> None:
    from testbed.core.journal import read_journal
    from testbed.scenario.parse import parse_scenario
    from tests.conftest import SCENARIOS

    text = (SCENARIOS / "storage_full_at_commit.yaml").read_text()
    text = text.replace(
        "{kind: storage_full, target: {storage: shared},", "{kind: storage_full, target: {rank: 1},"
    )
    text = text.replace("point: commit_fsync}", "point: shard_mid, errno: EDQUOT}")
    report = testbed_runs(parse_scenario(text, "quota.yaml"))
    assert report.verdict == "pass", report.data["checks"]
    events = read_journal(report.out_dir / "journal.jsonl")
    (failed,) = [e for e in events if e["event"] == "checkpoint_failed"]
    # rank 1 alone ran out of quota; the others wrote their shards, and the save failed for all of them
    assert failed["step"] == 8 and list(failed["errors"]) == ["1"] and failed["written"] == [0, 2, 3]
    assert os.strerror(errno.EDQUOT) in failed["errors"]["1"]
    commits = [e["step"] for e in events if e["event"] == "checkpoint_committed" and e["phase"] == "main"]
    assert commits[:2] == [4, 8]  # step 8 committed only on the second pass, after the quota healed
    (resume,) = [e for e in events if e["event"] == "resume" and e["phase"] == "main"]
    assert resume["from_step"] == 4


@pytest.mark.parametrize(
    ("old", "new", "needle"),
    [
        ("target: {storage: shared}", "target: {rank: 9}", "rank 9: give one of 0..3"),
        ("target: {storage: shared}", "target: {rank: 1}", "a rank's quota strikes its own shard, not the"),
    ],
    ids=["rank-outside", "quota-at-commit"],
)
def test_a_bad_quota_target_is_refused_with_a_fix(old: str, new: str, needle: str) -> None:
    from testbed.core.errors import ScenarioError
    from testbed.scenario.parse import parse_scenario
    from tests.conftest import SCENARIOS

    text = (SCENARIOS / "storage_full_at_commit.yaml").read_text()
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text.replace(old, new, 1), "s.yaml")
    assert needle in str(err.value), str(err.value)
