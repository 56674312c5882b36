"""Sharded checkpoints on disk, committed atomically, loaded without pickle.

Layout under a checkpoint root::

    step_00000020/                 committed (the rename is the commit)
      manifest.json                step, world, layout, include, per-rank files
      rank_00003/optimizer.npz     one .npz per component per rank
    step_00000030.tmp/             being written, or torn: never loaded

Writing: every rank writes its component files into the
temporary directory and fsyncs them; the controller then writes the manifest
(with each file's sha256, array shapes and dtypes), fsyncs it, renames the
directory to its final name and fsyncs the parent. Loading picks the newest
committed checkpoint whose every file matches its sha256, reads arrays with
``np.load(allow_pickle=False)`` and skips (and reports) any that does not verify.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from testbed.core.errors import CheckpointError

#: Every checkpointable component a training job has. A workload declares the
#: ones it owns; the completeness check compares a checkpoint against them.
COMPONENTS = ("params", "optimizer", "lr_scheduler", "rng", "data_cursor")

MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"^step_(\d{8})$")

#: Called at named points of a write (``shard.mid``: half of a rank's first file is on disk;
#: ``manifest.written``; ``renamed``): where the ``storage_torn_write`` fault and the tests kill the writer.
Hook = Callable[[str], None]


#: Called before each filesystem operation of a save with its name (``rank_00001/params.npz
#: write@0``, ``manifest.json fsync``, ``rename``, ...): a storage fault raises the ``OSError`` that
#: operation would (ENOSPC, EDQUOT), and the save fails there as it would on a full disk.
Disk = Callable[[str], None]


def _no_hook(point: str) -> None:
    return None


#: where a full disk (``storage_full``'s ``point``) makes a save fail, as a test on the point's name:
#: a shard file's creation, the write of a shard's first file from its middle, the manifest, the
#: rename that commits, the parent's fsync that makes the commit durable
FULL_AT: dict[str, Callable[[str], bool]] = {
    "shard": lambda at: "/" in at and at.endswith(" create"),
    "shard_mid": lambda at: re.search(r" write@[1-9]", at) is not None,
    "manifest": lambda at: at == f"{MANIFEST} write@0",
    "rename": lambda at: at == "rename",
    "commit_fsync": lambda at: at == "root fsync",
}


def room(at: str) -> None:
    """A disk with room: every operation goes through."""


def full_at(point: str, code: int) -> Disk:
    """A disk that fails with ``code`` (ENOSPC, EDQUOT) at ``point`` of :data:`FULL_AT`."""
    strikes = FULL_AT[point]

    def disk(at: str) -> None:
        if strikes(at):
            raise OSError(code, os.strerror(code), at)

    return disk


def step_dir(root: Path, step: int, tmp: bool = False) -> Path:
    """Directory of the checkpoint of ``step`` (``.tmp`` while being written)."""
    return root / (f"step_{step:08d}" + (".tmp" if tmp else ""))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_shard(
    tmp_dir: Path,
    rank: int,
    components: dict[str, dict[str, np.ndarray]],
    hook: Hook = _no_hook,
    disk: Disk = _no_hook,
) -> dict[str, Any]:
    """Write one rank's components into ``tmp_dir``; returns their manifest entries. A filesystem
    error (a full disk, a quota) is a :class:`CheckpointError` naming the operation it struck."""
    try:
        return _write_shard(tmp_dir, rank, components, hook, disk)
    except OSError as exc:
        raise CheckpointError(
            f"rank {rank}: writing its checkpoint shard failed: {exc}", rank=rank, errno=exc.errno
        ) from None


def _write_shard(
    tmp_dir: Path,
    rank: int,
    components: dict[str, dict[str, np.ndarray]],
    hook: Hook,
    at: Disk,
) -> dict[str, Any]:
    rank_dir = tmp_dir / f"rank_{rank:05d}"
    at(f"rank_{rank:05d} mkdir")
    rank_dir.mkdir(parents=True, exist_ok=True)
    entries: dict[str, Any] = {}
    for i, (name, arrays) in enumerate(components.items()):
        path = rank_dir / f"{name}.npz"
        where = str(path.relative_to(tmp_dir))
        buf = io.BytesIO()
        np.savez(buf, **arrays)  # type: ignore[arg-type]  # numpy stubs mistype **kwds
        data = buf.getbuffer()
        at(f"{where} create")
        with open(path, "wb") as f:
            half = len(data) // 2 if i == 0 else 0
            if half:
                at(f"{where} write@0")
                f.write(data[:half])
            if i == 0:  # a writer that dies here leaves a torn file behind
                f.flush()
                at(f"{where} fsync@{half}")
                os.fsync(f.fileno())
                hook("shard.mid")
            at(f"{where} write@{half}")
            f.write(data[half:])
            f.flush()
            at(f"{where} fsync")
            os.fsync(f.fileno())
        entries[name] = {
            "file": str(path.relative_to(tmp_dir)),
            "sha256": _sha256(path),
            "bytes": path.stat().st_size,
            "arrays": {k: {"shape": list(v.shape), "dtype": v.dtype.str} for k, v in arrays.items()},
        }
    at(f"rank_{rank:05d} fsync")
    _fsync_dir(rank_dir)
    return entries


def audit(components: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
    """What the completeness audit needs to know of one rank's saved state, without the arrays.

    ``moments_nonzero``: some Adam moment is not zero; ``adam_t``: the
    optimizer's step count; ``position``: the scheduler's; ``rng``: a digest
    of the RNG state; ``cursor``: the sampler's position.
    """
    found: dict[str, Any] = {}
    opt = components.get("optimizer")
    if opt is not None:
        moments = [v for k, v in opt.items() if k.startswith(("m.", "v."))]
        found["moments_nonzero"] = any(bool(np.any(v)) for v in moments)
        if "t" in opt:
            found["adam_t"] = int(opt["t"])
    if "lr_scheduler" in components:
        found["position"] = int(components["lr_scheduler"]["position"])
    if "rng" in components:
        h = hashlib.sha256()
        for k in sorted(components["rng"]):
            h.update(np.ascontiguousarray(components["rng"][k]).tobytes())
        found["rng"] = h.hexdigest()[:16]
    if "data_cursor" in components:
        found["cursor"] = [int(v) for arr in components["data_cursor"].values() for v in np.ravel(arr)]
    return found


#: the storage's fence: the newest group epoch; a commit that carries an older one is refused
FENCE = "FENCE"


def raise_fence(root: Path, epoch: int) -> None:
    """From now on, refuse every commit that carries an epoch below ``epoch`` (a fencing token)."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{FENCE}.tmp"
    tmp.write_text(str(epoch))
    os.replace(tmp, root / FENCE)


def fenced(root: Path, epoch: int | None) -> str | None:
    """Why a commit that carries ``epoch`` is refused (None: it is not; no epoch, no fence)."""
    fence = root / FENCE
    if epoch is None or not fence.is_file():
        return None
    newest = int(fence.read_text())
    if epoch < newest:
        return f"fenced: it carries group epoch {epoch}, the storage's fence is at epoch {newest}"
    return None


def commit(
    root: Path,
    step: int,
    manifest: dict[str, Any],
    hook: Hook = _no_hook,
    disk: Disk = _no_hook,
    epoch: int | None = None,
) -> Path:
    """Write the manifest into ``step``'s temporary directory and rename it into place. A filesystem
    error is a :class:`CheckpointError`, and the checkpoint is not committed: before the rename the
    temporary directory stays (never loaded); after it (the parent's fsync), the rename is undone,
    since the commit may not have reached the disk. A commit that carries an ``epoch`` older than the
    storage's fence (:func:`raise_fence`) is refused before anything is published."""
    tmp, final = step_dir(root, step, tmp=True), step_dir(root, step)
    refused = fenced(root, epoch)
    if refused is not None:
        raise CheckpointError(f"the commit of step {step}'s checkpoint was refused: {refused}", path=str(tmp))
    if final.exists():
        raise CheckpointError(
            f"checkpoint {final} already exists; a committed checkpoint is never overwritten",
            path=str(final),
        )
    renamed = False
    try:
        text = json.dumps(manifest, indent=1, sort_keys=True)
        disk(f"{MANIFEST} create")
        with open(tmp / MANIFEST, "w") as f:
            disk(f"{MANIFEST} write@0")
            f.write(text)
            f.flush()
            disk(f"{MANIFEST} fsync")
            os.fsync(f.fileno())
        disk("dir fsync")
        _fsync_dir(tmp)
        hook("manifest.written")
        disk("rename")
        os.rename(tmp, final)
        renamed = True
        hook("renamed")
        disk("root fsync")
        _fsync_dir(root)
    except OSError as exc:
        if renamed:
            os.rename(final, tmp)
        raise CheckpointError(
            f"committing the checkpoint of step {step} failed: {exc}; it is not committed, and the "
            "newest committed checkpoint stays the one to load",
            path=str(tmp),
            errno=exc.errno,
        ) from None
    return final


def committed(root: Path) -> list[tuple[int, Path]]:
    """(step, directory) of every committed checkpoint under ``root``, oldest first."""
    if not root.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)))


def quarantine(path: Path) -> Path:
    """Move a committed checkpoint that failed verification aside (``.bad``), so it is rewritten."""
    target = path.with_name(path.name + ".bad")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.bad{n}")
    os.rename(path, target)
    return target


def prune(root: Path, keep: int, verified: Collection[int] = ()) -> list[int]:
    """Remove all but the newest ``keep`` committed checkpoints (0: keep all), and never the newest of
    the ``verified`` steps (a hash vouched for them: a rollback needs one); returns the steps removed."""
    if keep <= 0:
        return []
    found = committed(root)
    protect = max((step for step, _ in found if step in verified), default=None)
    gone = [(step, path) for step, path in found[:-keep] if step != protect]
    for _, path in gone:
        shutil.rmtree(path)
    return [step for step, _ in gone]


@dataclass(frozen=True)
class Loadable:
    """A committed checkpoint that verified: its directory and manifest."""

    path: Path
    manifest: dict[str, Any]

    @property
    def step(self) -> int:
        """The global step the checkpoint was taken after."""
        return int(self.manifest["step"])

    def files_of(self, rank: int, only: tuple[str, ...] | None = None) -> dict[str, tuple[str, str]]:
        """``component -> (absolute file, sha256)`` for one rank (of the components in ``only``, if given)."""
        comps = self.manifest["ranks"][str(rank)]
        return {
            c: (str(self.path / e["file"]), e["sha256"])
            for c, e in comps.items()
            if only is None or c in only
        }


def verify(path: Path) -> Loadable:
    """Check a committed checkpoint's manifest and every file's sha256."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: manifest unreadable ({exc})", path=str(path)) from exc
    for rank, comps in manifest.get("ranks", {}).items():
        for name, entry in comps.items():
            file = path / entry["file"]
            if not file.is_file():
                raise CheckpointError(f"{path}: rank {rank} {name} file missing", path=str(path))
            if _sha256(file) != entry["sha256"]:
                raise CheckpointError(f"{path}: rank {rank} {name} fails its sha256", path=str(path))
    return Loadable(path, manifest)


def newest(
    root: Path,
    before: int | None = None,
    persisted_by: float | None = None,
    only: Collection[int] | None = None,
) -> tuple[Loadable | None, list[str]]:
    """The newest committed checkpoint (of a step below ``before``, and in ``only``, if given) that
    verifies.

    With ``persisted_by`` (a virtual time), an asynchronous checkpoint whose background
    write had not ended by then is not a candidate: it is moved aside (``.unpersisted``),
    as a failure would have cut its persistence short. Also returns why each newer one
    was skipped.
    """
    skipped: list[str] = []
    for step, path in reversed(committed(root)):
        if (before is not None and step >= before) or (only is not None and step not in only):
            continue
        try:
            found = verify(path)
        except CheckpointError as exc:
            skipped.append(str(exc))
            continue
        done = found.manifest.get("t_persisted")
        if persisted_by is not None and done is not None and float(done) > persisted_by:
            os.rename(path, path.with_name(path.name + ".unpersisted"))
            skipped.append(
                f"{path}: its background write ends at t={float(done):.6g} s, after the failure at "
                f"t={persisted_by:.6g} s: never persisted"
            )
            continue
        return found, skipped
    return None, skipped


def read_component(file: str, sha256: str) -> dict[str, np.ndarray]:
    """Load one component file after checking its sha256; never unpickles."""
    if _sha256(Path(file)) != sha256:
        raise CheckpointError(f"{file}: sha256 mismatch on load", path=file)
    try:
        with np.load(file, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except ValueError as exc:  # object arrays need pickle, which is refused
        raise CheckpointError(f"{file}: refused to load ({exc})", path=file) from exc
