"""Checkpoint storage that every node must share, checked at start with a marker file.

On one host every process sees the same files. On a Ray cluster of several
nodes the NPUs write their checkpoint shards on their own node, and the
controller commits and reads them on the driver's: the storage must be one
path every node mounts (NFS, a parallel file system). Before anything
trains, the driver writes a marker file with a random token under the
storage, and each supernode, on its own node, reads it back. A supernode
that cannot see it, or sees another token, names a storage that is not
shared: the run is refused (exit 254) with the node and the fix.

The path is expanded (``~``, ``$VARS``) where it is used, on each node, as
a shell on that host would: a path that names node-local storage
(``$LOCAL_SCRATCH/ckpt``) is caught by the same check.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from testbed.core.errors import ScenarioError

MARKER = ".testbed-storage-marker"


def resolve(storage: str) -> Path:
    """``storage`` as this process sees it (``~`` and ``$VARS`` expanded here)."""
    return Path(os.path.expanduser(os.path.expandvars(storage)))


def write_marker(storage: str) -> str:
    """Create the storage folder if needed and write a fresh marker in it; the marker's token."""
    root = resolve(storage)
    try:
        root.mkdir(parents=True, exist_ok=True)
        token = secrets.token_hex(8)
        (root / MARKER).write_text(token)
    except OSError as exc:
        raise ScenarioError(
            f"--storage {storage}: cannot write there ({exc.strerror}); give a folder this host can write",
            storage=storage,
        ) from None
    return token


def read_marker(storage: str) -> str | None:
    """The marker token as this node sees it, or None when it sees no marker."""
    try:
        return (resolve(storage) / MARKER).read_text()
    except OSError:
        return None


def refuse_unless_shared(storage: str, token: str, seen: dict[int, tuple[str | None, str]]) -> None:
    """Raise when a supernode (``seen``: supernode -> (token it read, its node address)) does not see
    the marker the driver wrote."""
    blind = {node: where for node, (got, where) in sorted(seen.items()) if got != token}
    if not blind:
        return
    node, where = next(iter(blind.items()))
    raise ScenarioError(
        f"checkpoint storage {storage} is not shared: supernode {node} on the Ray node at {where} does not "
        f"see the marker {MARKER} that the driver wrote there ({len(blind)} of {len(seen)} supernodes "
        "are blind to it). Give --storage a path every node mounts (NFS, a parallel file system), or "
        "run on one host",
        storage=storage,
        supernodes=sorted(blind),
    )
