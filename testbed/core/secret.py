"""The run's secret: what every listener of a run asks a connecting peer to prove it knows.

The driver makes one per run (:meth:`RunSecret.new`, 32 random bytes) and
hands it to the supernode actors as part of their start-up arguments through
Ray; each supernode hands it to the NPU processes it forks over the
socketpair that starts them. It is never written anywhere: its ``repr`` and
``str`` hide it, so a journal event, a report or a log line that held it by
mistake would show ``RunSecret(hidden)``, never its bytes.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Any

#: bytes of randomness in a run's secret (as multiprocessing's default authkey)
SECRET_BYTES = 32


class RunSecret:
    """A run's secret key: compared in constant time, never shown."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError(f"a run's secret needs at least 16 bytes, got {len(key)}")
        self._key = bytes(key)

    @classmethod
    def new(cls) -> RunSecret:
        """A fresh secret from the operating system's random source."""
        return cls(secrets.token_bytes(SECRET_BYTES))

    @property
    def key(self) -> bytes:
        """The key itself, for an HMAC; never print or store it."""
        return self._key

    def __repr__(self) -> str:
        return "RunSecret(hidden)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunSecret) and hmac.compare_digest(self._key, other._key)

    def __hash__(self) -> int:
        return hash((RunSecret, len(self._key)))  # never the key's own hash: it would leak bits of it

    def __reduce__(self) -> tuple[Any, ...]:
        return (RunSecret, (self._key,))
