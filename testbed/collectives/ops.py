"""Reduction operators and element types of the collectives.

Ops: ``sum``, ``avg`` (a sum divided by the group size at the end), ``max``,
``min``, ``prod``. Types: float32, float64, int32, int64, and bfloat16 carried
as uint16 bit patterns (``bf16=True``): each reduction widens to float32 and
rounds back to the nearest even bfloat16, as accelerators do.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from testbed.core.errors import TestbedError

UFUNCS: dict[str, Callable[..., np.ndarray]] = {
    "sum": np.add,
    "avg": np.add,
    "prod": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
}
DTYPES = ("float32", "float64", "int32", "int64")
_SUPPORTED = frozenset(np.dtype(name) for name in DTYPES)  # dtype.name is slow on a per-message path


def split(flat: np.ndarray, n: int) -> list[np.ndarray]:
    """``flat`` cut into ``n`` views as ``np.array_split`` cuts it (the first ``len % n`` one element
    longer), at a fraction of its cost: a small collective's split took as long as its reduction."""
    q, r = divmod(flat.shape[0], n)
    bounds = [i * q + min(i, r) for i in range(n + 1)]
    return [flat[bounds[i] : bounds[i + 1]] for i in range(n)]


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) to float32."""
    out: np.ndarray = (bits.astype(np.uint32) << 16).view(np.float32)
    return out


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 to bfloat16 bit patterns (uint16), rounding to nearest even."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    bias = ((u >> 16) & 1) + np.uint32(0x7FFF)
    out: np.ndarray = ((u + bias) >> 16).astype(np.uint16)
    return out


def check(buf: np.ndarray, op: str, bf16: bool = False, out: np.ndarray | None = None) -> None:
    """Raise a clear error for an op or element type the collectives do not support, or an output
    buffer ``out`` that cannot take the result."""
    if out is not None and (
        out.shape != buf.shape
        or out.dtype != buf.dtype
        or not out.flags.c_contiguous
        or not out.flags.writeable
    ):
        raise TestbedError(
            f"out must be a writeable, contiguous array of the input's shape {buf.shape} and type "
            f"{buf.dtype}, got shape {out.shape} of {out.dtype}; pass out=None for a new array, or the "
            "input itself to reduce in place",
            shape=list(out.shape),
        )
    if op not in UFUNCS:
        raise TestbedError(f"unknown reduction op '{op}'; use one of {', '.join(UFUNCS)}", op=op)
    if bf16:
        if buf.dtype != np.uint16:
            raise TestbedError(f"bf16=True needs uint16 bit patterns, got {buf.dtype}", dtype=str(buf.dtype))
        return
    if buf.dtype not in _SUPPORTED:
        raise TestbedError(
            f"element type {buf.dtype} is not supported; use {', '.join(DTYPES)} or bfloat16 as uint16",
            dtype=str(buf.dtype),
        )
    if op == "avg" and buf.dtype.kind == "i":
        raise TestbedError("op 'avg' on integers would truncate; use 'sum' and divide yourself", op=op)


def combine(a: np.ndarray, b: np.ndarray, op: str, bf16: bool = False) -> np.ndarray:
    """``a op b`` elementwise, in the element type of ``a``."""
    if bf16:
        return f32_to_bf16(UFUNCS[op](bf16_to_f32(a), bf16_to_f32(b)))
    out: np.ndarray = UFUNCS[op](a, b).astype(a.dtype, copy=False)
    return out


def finish(buf: np.ndarray, op: str, n: int, bf16: bool = False) -> np.ndarray:
    """Apply what an op does after the reduction (``avg`` divides by ``n``)."""
    if op != "avg":
        return buf
    if bf16:
        return f32_to_bf16(bf16_to_f32(buf) / np.float32(n))
    out: np.ndarray = (buf / buf.dtype.type(n)).astype(buf.dtype, copy=False)
    return out
