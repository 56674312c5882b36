"""The testbed's error types: one root, every error picklable and self-explaining.

Errors cross Ray actor boundaries, so each one is rebuilt from its keyword
fields when unpickled (``__reduce__``), and each message names the value, the
place and the fix.
"""

from __future__ import annotations

from typing import Any


def _rebuild(cls: type[TestbedError], fields: dict[str, Any]) -> TestbedError:
    return cls(**fields)


class TestbedError(Exception):
    """Root of every error the testbed raises on purpose."""

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields
        for key, value in fields.items():
            setattr(self, key, value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), {"message": self.message, **self.fields}))

    def __str__(self) -> str:
        return self.message


class ScenarioError(TestbedError):
    """A scenario file or command-line argument is invalid (exit 254).

    ``problems`` holds every problem found, each already formatted with its
    file, line, field path and a hint (by default the message itself: one problem).
    """

    def __init__(self, message: str, problems: list[str] | None = None, **fields: Any) -> None:
        super().__init__(message, problems=list(problems or [message]), **fields)


class HarnessHang(TestbedError):
    """A real (wall-clock) wait passed its guard: a testbed failure, never a modelled timeout."""


class HeadLost(TestbedError):
    """Ray's head (its GCS) stopped accepting connections: the run cannot go on on this Ray; it can
    be resumed on another (``testbed resume``)."""


class LinkSetupTimeout(TestbedError):
    """Link setup (建链) between two ranks took longer than the connect timeout (HCCL EI0006)."""


class LinkSetupError(TestbedError):
    """Link setup failed right after connect: the two sides disagree (HCCL EI0005)."""


class RankHung(TestbedError):
    """A rank's process is frozen (alive, answering nothing): the controller stopped waiting for it."""


class ProcessDied(TestbedError):
    """A rank's process is gone (killed, or crashed): its supernode saw its socket end."""


class UnsupportedOperator(TestbedError):
    """A rank's device lacks an operator the model uses (a stack or firmware version without it)."""


class DeviceFault(TestbedError):
    """An operation on a rank's device failed for a value it was handed (an index out of range: what
    an illegal address or a device-side assert looks like from the host). Fields: ``rank``, ``op``,
    ``step``, ``t``; ``sdc``: the silent corruption that made the bad value, when one did."""


class CollectiveTimeout(TestbedError):
    """A receive waited longer than the execution timeout, in virtual time.

    ``true_timeout`` classifies it: true when the wait could never have ended
    (a dropped link, a dead or hung peer), false when the peer was alive and
    only slow (the timeout was too tight).
    """


class PeerLost(TestbedError):
    """A peer of a collective died; raised on the survivors.

    Fields: ``rank`` (who raises), ``peer`` (who died), ``wait_start`` (the
    virtual time the blocked receive began), ``how`` (``eof`` when the dead
    peer's socket closed, ``abort`` when a neighbour forwarded the group abort).
    """

    rank: int
    peer: int
    wait_start: float
    how: str


class DeviceOOM(TestbedError):
    """No free block of a rank's device memory can hold the request (fields: request, free_total,
    largest_free, rank)."""


class KVCacheFull(TestbedError):
    """A serving NPU's paged KV cache has no free block for a request's next tokens (the KV-cache
    OOM): the message names the request, its length and the cache's state."""


class CheckpointError(TestbedError):
    """A checkpoint could not be written, verified or loaded."""


class Preempted(TestbedError):
    """A rank got its preemption notice (a real SIGTERM) under ``on_notice: abort``: it leaves the step
    in flight, and so does every rank that hears of it (fields: ``rank``, ``step``, ``t``, ``preempted``)."""


class RecoveryFailed(TestbedError):
    """The recovery policy gave up (no strategy left, or too many restarts)."""


class SafeguardTripped(TestbedError):
    """A ``safeguards`` condition of the scenario stopped the run (exit 3)."""


class FrameError(TestbedError):
    """A peer that proved the run's secret sent bytes that break the wire format (a length past the
    limit, a header that is not a JSON object, an unknown kind, a rank outside the world): the link
    it came on is failed, and the message names the peer, the listener and what was wrong."""
