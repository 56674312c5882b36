"""The ``expect`` section: what a run must show for its verdict, training's and serving's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from testbed.core.registry import CHECKS
from testbed.scenario.fields import choice, custom, flag, integer, number, seconds

#: The verdicts a scenario can declare (``expect.verdict``), as a run reports them.
VERDICTS = ("pass", "fail", "unknown", "aborted")
#: The detectors a failure can be found by (``expect.detected_by``).
DETECTORS = (
    "heartbeat",
    "exec_timeout",
    "learned_step_timeout",
    "connect_timeout",
    "device_oom",
    "operator_error",
    "device_fault",
    "validator",
    "parameter_hash",
    "preemption",
    "controller",
    "ray_head",
)


def _tolerance_schema() -> dict[str, Any]:
    one = {"type": "number", "minimum": 0}
    return {"oneOf": [one, {"type": "array", "items": one, "minItems": 2, "maxItems": 2}]}


def _names_schema(names: tuple[str, ...]) -> Any:
    return lambda: {
        "oneOf": [{"enum": sorted(names)}, {"type": "array", "items": {"enum": sorted(names)}, "minItems": 1}]
    }


def _check_names_schema() -> dict[str, Any]:
    return _names_schema(tuple(CHECKS))()


#: the serving keys: a scenario that leaves them unset hashes as it did before they existed
SERVING_KEYS = ("lost_requests", "ttft_p99_s", "tpot_p99_s", "slo_attainment", "tokens_identical")
#: the integrity keys, likewise
INTEGRITY_KEYS = ("sdc_detected", "max_detection_steps", "max_false_alarms")
#: later expect keys, likewise
LATER_EXPECT_KEYS = ("reference_run",)
#: the checks that compare the run with the uninterrupted reference run (``reference_run: false``
#: leaves them without their yardstick)
AGAINST_REFERENCE = ("checkpoint_complete", "matches_uninterrupted")


@dataclass(frozen=True)
class Range:
    """An inclusive tolerance ``[lo, hi]`` (a scalar in a scenario is one end of it, or both)."""

    lo: float
    hi: float

    def holds(self, value: float) -> bool:
        """``lo <= value <= hi``."""
        return self.lo <= value <= self.hi

    def __str__(self) -> str:
        return f"[{self.lo:g}, {self.hi:g}]"


@dataclass(frozen=True)
class Expect:
    """``expect``: what the run must show for a pass verdict (unset: not checked)."""

    recovered: bool | None = flag(None, "every failure recovered and the run finished")
    max_recovery_s: float | None = seconds(None, 0.0, doc="the slowest recovery's bound", optional=True)
    checkpoint_complete: bool | None = flag(None, "every component saved, and a resume bit for bit")
    matches_uninterrupted: bool | None = flag(None, "final parameters equal an uninterrupted run's")
    #: False: no reference run after a recovery (a long goodput rehearsal in half the time); the
    #: checks that compare with it say they did not
    reference_run: bool | None = flag(
        None,
        "false: skip the uninterrupted reference run after a recovery (about half a recovered run's "
        "time); the bit-for-bit comparisons are then not judged",
    )
    max_failures: int | None = integer(None, 0, doc="at most this many failures", optional=True)
    min_goodput: float | None = number(None, 0.0, 1.0, "at least this goodput", optional=True)
    #: tolerances: a scalar (failures: exactly; recovery_s: at most; goodput: at least) or [low, high]
    failures: Range | None = custom(
        None, "tolerance", _tolerance_schema, "exactly this many failures, or [low, high]", ("exact", 1e9)
    )
    recovery_s: Range | None = custom(
        None,
        "tolerance",
        _tolerance_schema,
        "each recovery at most this long, or within [low, high]",
        ("max", 1e12),
    )
    goodput: Range | None = custom(
        None, "tolerance", _tolerance_schema, "at least this goodput, or within [low, high]", ("min", 1.0)
    )
    #: the detectors allowed to find the failures (a name or a list of names)
    detected_by: tuple[str, ...] | None = custom(
        None, "detectors", _names_schema(DETECTORS), "the detectors allowed to find the failures"
    )
    #: serving: requests lost at most, p99 latencies at most, share within the SLO at least, outputs
    #: equal to the undisturbed run's
    lost_requests: int | None = integer(
        None, 0, doc="serving: at most this many requests lost", optional=True
    )
    ttft_p99_s: float | None = seconds(
        None, 0.0, doc="serving: p99 time to first token at most", optional=True
    )
    tpot_p99_s: float | None = seconds(
        None, 0.0, doc="serving: p99 time per output token at most", optional=True
    )
    slo_attainment: float | None = number(
        None, 0.0, 1.0, "serving: at least this share of requests within the SLO", optional=True
    )
    tokens_identical: bool | None = flag(None, "serving: every output equals the undisturbed run's")
    #: integrity: every silent corruption detected, within so many steps; alarms with no corruption
    sdc_detected: bool | None = flag(None, "integrity: every silent corruption detected")
    max_detection_steps: int | None = integer(
        None, 0, doc="integrity: each corruption detected within this many steps of its onset", optional=True
    )
    max_false_alarms: float | None = number(
        None, 0.0, 1000.0, "integrity: detections with no corruption, per 1,000 steps, at most", optional=True
    )
    #: the verdict the scenario means to come to: ``pass``, or ``fail`` (a scenario that demonstrates a
    #: wrong policy), ``aborted`` or ``unknown``; a suite (``testbed suite``) holds the run to it
    verdict: str = choice("pass", lambda: VERDICTS, "verdict", "the verdict the run means to come to")
    #: the checks that must fail, and no other (with ``verdict: fail`` or ``aborted``)
    fails: tuple[str, ...] = custom(
        (), "check_names", _check_names_schema, "the checks that must fail, and no other"
    )
