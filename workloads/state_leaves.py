"""A program's state as leaves: every tensor, array and number of every Stateful, hashed one by one.

The resume audit reads each Stateful's ``state_dict()`` at every step
boundary, independently of the program's own save, and flattens it into
leaves named by their path (``optimizer.state.3.exp_avg``,
``scheduler.last_epoch``). Each leaf is hashed (dtype, shape and bytes), and a
small one (a number, or an array of at most :data:`SMALL` elements) keeps its
value too, so a report can say ``scheduler.last_epoch 27 != 20``. The
process-global random generators a program may use without declaring them
are leaves as well: ``rng.torch``, ``rng.numpy``, ``rng.python``. PyTorch is
read only if the program imported it.
"""

from __future__ import annotations

import hashlib
import random
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

#: arrays of at most this many elements keep their values beside their hash
SMALL = 4

#: a leaf: its short hash, and its value when small (else None)
Leaf = tuple[str, Any]


def _hash(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return h.hexdigest()[:16]


def _as_array(value: Any) -> np.ndarray | None:
    """A tensor (of any framework with ``.detach().cpu().numpy()``) or an array as numpy, else None."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        tensor = value.detach().cpu()
        if str(getattr(tensor, "dtype", "")) == "torch.bfloat16":
            tensor = tensor.view(dtype=sys.modules["torch"].int16)  # bit patterns: numpy has no bf16
        return np.asarray(tensor.numpy())
    return None


def leaf(value: Any) -> Leaf:
    """One leaf's hash and, when small, its value (JSON-ready)."""
    arr = _as_array(value)
    if arr is not None:
        arr = np.ascontiguousarray(arr)
        digest = _hash(arr.dtype.str.encode(), str(arr.shape).encode(), arr.tobytes())
        small = arr.tolist() if arr.size <= SMALL and arr.dtype.kind in "biuf" else None
        return digest, small
    if value is None or isinstance(value, (bool, int, float)):
        return _hash(repr(value).encode()), value
    if isinstance(value, str):
        return _hash(value.encode()), value if len(value) <= 64 else None
    if isinstance(value, bytes):
        return _hash(value), None
    return _hash(type(value).__name__.encode(), repr(value).encode()), None


def flatten(prefix: str, value: Any, out: dict[str, Leaf]) -> None:
    """Add the leaves of ``value`` under ``prefix``: mappings and sequences are walked into, a sequence
    of plain numbers is one leaf."""
    if isinstance(value, Mapping):
        for key in sorted(value, key=str):
            flatten(f"{prefix}.{key}", value[key], out)
    elif isinstance(value, (list, tuple)):
        if value and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            out[prefix] = leaf(np.asarray(value))
        else:
            for i, v in enumerate(value):
                flatten(f"{prefix}.{i}", v, out)
    else:
        out[prefix] = leaf(value)


def global_rngs() -> dict[str, Leaf]:
    """The process-global generators: Python's ``random``, numpy's legacy one, and torch's CPU one
    (when the program imported torch)."""
    _, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    rest = repr((int(pos), int(has_gauss), float(cached))).encode()
    out: dict[str, Leaf] = {
        "rng.python": leaf(repr(random.getstate())),
        "rng.numpy": (_hash(np.asarray(keys).tobytes(), rest), None),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        out["rng.torch"] = leaf(torch.get_rng_state())
    return out


def leaves(statefuls: Mapping[str, Any]) -> dict[str, Leaf]:
    """Every leaf of every Stateful's ``state_dict()``, and the global generators'."""
    out: dict[str, Leaf] = {}
    for name, stateful in statefuls.items():
        flatten(name, stateful.state_dict(), out)
    out.update(global_rngs())
    return out
