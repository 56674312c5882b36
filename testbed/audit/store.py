"""A program's checkpoints: each rank's folder, committed only when every rank's save returned.

Layout under a case's root::

    step_00000005/                 committed: the rename is the commit
      manifest.json                boundary, world, every file's sha256
      rank_00001/...               what the program's save wrote
    step_00000006.tmp/             being written, or torn by a kill: never loaded

A load takes the newest committed checkpoint whose every file still has its
sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

MANIFEST = "manifest.json"
_COMMITTED = re.compile(r"^step_(\d{8})$")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(root: Path, boundary: int, world: int) -> Path:
    """Hash every file of the checkpoint after ``boundary`` steps, write its manifest, and rename its
    temporary directory to its final name."""
    tmp = root / f"step_{boundary:08d}.tmp"
    files = {str(p.relative_to(tmp)): _sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
    for path in files:
        _fsync(tmp / path)
    (tmp / MANIFEST).write_text(json.dumps({"boundary": boundary, "world": world, "files": files}))
    _fsync(tmp / MANIFEST)
    final = root / f"step_{boundary:08d}"
    tmp.rename(final)
    _fsync(root)
    return final


def intact(path: Path) -> bool:
    """Whether a committed checkpoint still has its manifest and every file its sha256."""
    try:
        files = json.loads((path / MANIFEST).read_text())["files"]
        return all(_sha256(path / name) == sha for name, sha in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def newest(root: Path) -> tuple[int, Path] | None:
    """The newest intact committed checkpoint under ``root``: (its boundary, its folder)."""
    found = sorted(
        (int(m.group(1)), p)
        for p in (root.iterdir() if root.is_dir() else [])
        if (m := _COMMITTED.match(p.name)) and p.is_dir()
    )
    for boundary, path in reversed(found):
        if intact(path):
            return boundary, path
    return None
