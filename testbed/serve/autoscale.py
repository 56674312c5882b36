"""Elastic serving: instances started and stopped on load, as a serving autoscaler does.

A fleet under an :class:`AutoscalePolicy` begins with ``min_instances``
running; the others are stopped (their NPUs free for other work). The load
is the requests outstanding per instance running or starting, sampled at each
arrival (the concurrency signal Knative's and KServe's autoscalers scale
on). When it reaches ``scale_out_at``, the next stopped instance starts and
takes requests ``startup_s`` later (loading its weights, warming up); while
every instance taking requests holds that many, an arrival waits at the
router for the next one to come up, as Knative's activator buffers requests
for a scaling revision, rather than queue behind the busy. When
it has stayed below half of that for ``scale_in_after``, the newest
instance beyond the minimum drains: it takes no new request and stops once
it holds none. An instance lost to a fault is replaced from the stopped
ones when fewer than the minimum run. Every decision is a :class:`Scaling`;
the instance-seconds they add up to (an instance counts from its start to
its stop) are what the autoscaling cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from testbed.core.errors import TestbedError


@dataclass(frozen=True)
class AutoscalePolicy:
    """Start one more instance when the requests outstanding per instance running or starting reach
    ``scale_out_at``; it takes requests ``startup_s`` later; drain the newest beyond
    ``min_instances`` once the load has stayed below half of ``scale_out_at`` for
    ``scale_in_after_s``."""

    min_instances: int = 1
    scale_out_at: int = 8
    startup_s: float = 30.0
    scale_in_after_s: float = 30.0

    def __post_init__(self) -> None:
        if self.min_instances < 1 or self.scale_out_at < 1:
            raise TestbedError(
                f"autoscale needs min_instances >= 1 and scale_out_at >= 1, got {self.min_instances} and "
                f"{self.scale_out_at}; raise them",
            )


@dataclass(frozen=True)
class Scaling:
    """One decision: an instance started (``out``: it takes requests at ``ready_s``), drained
    (``drain``: it takes no new request) or stopped (``in``: it holds none), at ``at_s``, with the
    requests outstanding per instance running or starting then, and why."""

    instance: str
    action: str
    at_s: float
    ready_s: float
    outstanding: float
    reason: str

    def fields(self) -> dict[str, object]:
        """As the journal's ``instance_scaled`` event has it."""
        return {
            "instance": self.instance,
            "action": self.action,
            "at_s": self.at_s,
            "ready_s": self.ready_s,
            "outstanding": self.outstanding,
            "reason": self.reason,
        }


class Scaler:
    """Which of a fleet's instances run, and since when: the policy's decisions, event by event."""

    def __init__(self, policy: AutoscalePolicy, names: list[str]) -> None:
        self.policy = policy
        self.order = list(names)
        first = names[: policy.min_instances]
        #: running instances (draining ones too) and when each takes requests
        self.ready = dict.fromkeys(first, 0.0)
        #: when each running instance started (for instance-seconds)
        self.started = dict.fromkeys(first, 0.0)
        self.draining: set[str] = set()
        #: since when the load has stayed below the scale-in bound (None: it is not below it)
        self.low_since: float | None = None
        self.spent_s = 0.0
        self.log: list[Scaling] = []
        #: the most instances running at once
        self.peak = len(first)

    @property
    def serving(self) -> list[str]:
        """The running instances that are not draining."""
        return [n for n in self.order if n in self.ready and n not in self.draining]

    def routable(self, now: float) -> list[str]:
        """The instances that take requests at ``now``."""
        return [n for n in self.serving if self.ready[n] <= now]

    def next_ready(self) -> float:
        """When the next instance starting takes requests (inf: none is serving)."""
        return min((self.ready[n] for n in self.serving), default=math.inf)

    def next_start(self, now: float) -> float:
        """When the next instance still starting at ``now`` takes requests (inf: none is starting)."""
        return min((self.ready[n] for n in self.serving if self.ready[n] > now), default=math.inf)

    def full(self, held: int) -> bool:
        """An instance holding ``held`` requests has reached the load it is scaled for."""
        return held >= self.policy.scale_out_at

    def load(self, now: float, outstanding: int, available: set[str], empty: set[str]) -> list[Scaling]:
        """The decisions ``outstanding`` requests at ``now`` call for: start one of ``available``,
        or drain the newest (stopped at once if it is one of ``empty``)."""
        serving = self.serving
        per = outstanding / max(1, len(serving))
        if per >= self.policy.scale_out_at:
            self.low_since = None
            start = self._start(now, per, available, "load")
            return [start] if start else []
        if per >= self.policy.scale_out_at / 2:
            self.low_since = None
            return []
        if self.low_since is None:
            self.low_since = now
        if now - self.low_since < self.policy.scale_in_after_s or len(serving) <= self.policy.min_instances:
            return []
        self.low_since = now  # the next one waits as long again
        name = serving[-1]
        self.draining.add(name)
        self.log.append(Scaling(name, "drain", now, now, per, "low load"))
        out = [self.log[-1]]
        if name in empty:
            out.append(self._stop(name, now))
        return out

    def emptied(self, name: str, now: float) -> Scaling | None:
        """Instance ``name`` holds nothing from ``now``: a draining one stops."""
        return self._stop(name, now) if name in self.draining else None

    def replace(self, name: str, now: float, outstanding: int, available: set[str]) -> Scaling | None:
        """Instance ``name`` was lost, noticed at ``now``: forget it, and start another if fewer than
        the minimum now serve."""
        if name in self.ready:
            self.spent_s += now - self.started.pop(name)
            del self.ready[name]
            self.draining.discard(name)
        if len(self.serving) >= self.policy.min_instances:
            return None
        return self._start(now, outstanding / max(1, len(self.serving)), available, "replace")

    def finish(self, end_s: float) -> float:
        """Instance-seconds spent, every running instance counted to ``end_s``."""
        return self.spent_s + sum(max(0.0, end_s - t) for t in self.started.values())

    def _start(self, now: float, per: float, available: set[str], reason: str) -> Scaling | None:
        name = next((n for n in self.order if n in available and n not in self.ready), None)
        if name is None:
            return None
        ready = now + self.policy.startup_s
        self.ready[name], self.started[name] = ready, now
        self.peak = max(self.peak, len(self.ready))
        self.log.append(Scaling(name, "out", now, ready, per, reason))
        return self.log[-1]

    def _stop(self, name: str, at: float) -> Scaling:
        self.spent_s += at - self.started.pop(name)
        del self.ready[name]
        self.draining.discard(name)
        self.log.append(Scaling(name, "in", at, at, 0.0, "drained"))
        return self.log[-1]
