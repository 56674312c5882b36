"""Durations with units, as scenario files write them (``30s``, ``150ms``, ``2h``)."""

from __future__ import annotations

import re
from decimal import Decimal

_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s|min|m|h)?\s*$")


def parse_duration(value: object) -> float | None:
    """Seconds for ``value`` (a number of seconds, or a string like ``30s``); None if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if value >= 0 else None
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            return float(m.group(1)) * _UNITS[m.group(2) or "s"]
    return None


_SIZE_UNITS = {
    "b": 1,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?\s*$", re.IGNORECASE)


def parse_size(value: object) -> int | None:
    """Bytes for ``value`` (a number, or a string like ``16MiB``, ``512 KiB``); None if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m:
            return int(float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "b").lower()])
    return None


_BINARY = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit under it: ``512 bytes``, ``93.0 MiB``, ``4.70 GiB``;
    past exbibytes, in scientific notation."""
    for power, unit in reversed(list(enumerate(_BINARY))):
        if n >= 1024**power:
            if power == len(_BINARY) - 1 and n >= 1024 ** (power + 1):
                try:
                    return f"{float(n):.3g} bytes"
                except OverflowError:  # an int past any float (a mistyped size): said all the same
                    return f"{Decimal(n):.3g} bytes"
            value = n / 1024**power
            return f"{value:.0f} {unit}" if power == 0 else f"{value:.3g} {unit}"
    return f"{n:.0f} bytes"


_DECIMAL = ("", "k", "M", "G", "T", "P", "E", "Z")


def format_flops(n: float) -> str:
    """``n`` floating-point operations in the largest decimal unit under it: ``7.96 MFLOP``,
    ``2.70 PFLOP`` (past zetta, in scientific notation)."""
    for power in range(len(_DECIMAL) - 1, 0, -1):
        if n >= 1000**power:
            if power == len(_DECIMAL) - 1 and n >= 1000 ** (power + 1):
                return f"{n:.3g} FLOP"
            return f"{n / 1000**power:.3g} {_DECIMAL[power]}FLOP"
    return f"{n:.3g} FLOP"


#: rate units in bytes per second: ``bit`` forms are tc's (``gbit``: 10^9 bits/s), ``bit/s`` forms the
#: same, ``B/s`` forms are bytes (``GB/s``: 10^9 bytes/s). ``bps`` is left out on purpose: tc and Chaos
#: Mesh read ``gbps`` as gigabytes a second, most people as gigabits (see :data:`AMBIGUOUS_RATE`).
_RATE_UNITS = {
    **{f"{p}bit": m / 8 for p, m in (("", 1), ("k", 1e3), ("m", 1e6), ("g", 1e9), ("t", 1e12))},
    **{f"{p}bit/s": m / 8 for p, m in (("", 1), ("k", 1e3), ("m", 1e6), ("g", 1e9), ("t", 1e12))},
    **{f"{p}b/s": m for p, m in (("", 1), ("k", 1e3), ("m", 1e6), ("g", 1e9), ("t", 1e12))},
    **{f"{p}ib/s": float(2**e) for p, e in (("k", 10), ("m", 20), ("g", 30), ("t", 40))},
}
#: What a rate written in ``bps`` units is told: it means bytes to tc and Chaos Mesh, bits to most people.
AMBIGUOUS_RATE = (
    "a 'bps' unit is ambiguous (tc and Chaos Mesh read 1gbps as a gigabyte a second, most people as a "
    "gigabit): write bits as 1gbit or 1Gbit/s, bytes as 1GB/s"
)
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e[+-]?\d+)?)\s*([a-z]*(?:/s)?)\s*$", re.IGNORECASE)


def parse_rate(value: object) -> float | None:
    """Bytes per second for ``value``: a number (bytes per second) or a string like ``10gbit`` or
    ``10Gbit/s`` (bits per second) or ``1.25GB/s``, ``100MiB/s`` (bytes); None if it is not one, or not
    above zero (a ``bps`` unit too: :data:`AMBIGUOUS_RATE`)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if value > 0 else None
    if isinstance(value, str):
        m = _RATE.match(value)
        unit = (m.group(2) or "b/s").lower() if m else ""
        if m and unit in _RATE_UNITS:
            rate = float(m.group(1)) * _RATE_UNITS[unit]
            return rate if rate > 0 else None
    return None
