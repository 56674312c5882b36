"""What one actor call on a rank came back with, and how to read a Ray error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from testbed.core.errors import ProcessDied, TestbedError


@dataclass(frozen=True)
class Outcome:
    """The result of one actor call: a value, or the error as Ray reported it."""

    value: Any = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        """True when the call returned normally."""
        return self.error is None


def unwrap(exc: BaseException) -> BaseException:
    """The testbed error inside a Ray task error, else the Ray error itself."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, TestbedError):
        return cause
    return exc


def is_death(exc: BaseException | None) -> bool:
    """True when the process of a rank is gone: its supernode saw it end, or Ray reports the
    supernode's own actor dead (its Ray node was lost)."""
    if isinstance(exc, ProcessDied):
        return True
    return exc is not None and type(exc).__name__ in {"ActorDiedError", "ActorUnavailableError"}


def describe_ray_error(exc: BaseException) -> str:
    """The error's class and the first line of its message, for the journal."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"


def values_or_raise(results: dict[int, Outcome]) -> dict[int, Any]:
    """Each rank's value, or the root cause if any rank failed: the error a rank raised itself
    (``how="direct"``), not the copies its peers raised when the group was aborted."""
    errors = [out.error for out in results.values() if out.error is not None]
    if errors:
        direct = [e for e in errors if isinstance(e, TestbedError) and e.fields.get("how") == "direct"]
        raise (direct or errors)[0]
    return {r: out.value for r, out in results.items()}
