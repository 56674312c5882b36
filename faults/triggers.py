"""When a fault fires: the trigger forms every fault kind shares.

- ``at: {step: N}``: at the boundary before step N (a kind may add ``during``,
  the point of the step it acts at);
- ``at: {every: N, from: S, until: U}``: at steps S, S+N, ... up to U (S
  defaults to N, U to the last step), each firing a fault of its own that
  draws its own random target;
- ``at: {time: DURATION}``: at the first step boundary at or after that
  virtual time (``2h``, ``90s``), whichever step that is in this run;
- ``at: {mtbf: DURATION}``: a Poisson process, or with ``arrivals: stratified`` one failure in
  each MTBF-long window (``node_kill`` only;
  :mod:`faults.arrivals`).

A fault kind validates and plans its ``at`` as if it were ``{step: N, ...}``;
this module turns ``every`` and ``time`` into that form (:func:`as_step`) and
back into planned faults (:func:`plan_all`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

from faults.kind import ClusterFacts, FaultKind, FaultSpec, PlannedFault, Problems
from testbed.core.units import parse_duration

#: the fields of the shared triggers (a kind's own ``at`` fields, such as ``during``, pass through)
EVERY_FIELDS = ("every", "from", "until")


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def trigger_problems(spec: FaultSpec, facts: ClusterFacts) -> Problems:
    """Problems with ``every``/``from``/``until`` or ``time`` (none for other triggers)."""
    at = spec.at
    if "time" in at:
        t = parse_duration(at["time"])
        problems: Problems = []
        if t is None or t <= 0:
            problems.append(
                (("at", "time"), f"time must be a positive duration like '90s' or '2h', got {at['time']!r}")
            )
        clash = sorted({"step", "mtbf", *EVERY_FIELDS} & set(at))
        if clash:
            problems.append((("at", clash[0]), f"'{clash[0]}' cannot go with time: give one trigger"))
        return problems
    if "every" not in at:
        stray = [k for k in ("from", "until") if k in at]
        return [(("at", stray[0]), f"'{stray[0]}' goes with 'every: N'")] if stray else []
    return _every_problems(spec, facts)


def _every_problems(spec: FaultSpec, facts: ClusterFacts) -> Problems:
    at, problems = spec.at, Problems()
    every = at["every"]
    if not _int(every) or every < 1:
        return [(("at", "every"), f"every must be a whole number of steps >= 1, got {every!r}")]
    first, last = at.get("from", every), at.get("until", facts.steps)
    for key, value in (("from", first), ("until", last)):
        if not _int(value) or not 1 <= value <= facts.steps:
            problems.append((("at", key), f"{key} must be a step in 1..{facts.steps}, got {value!r}"))
    if not problems and first > last:
        problems.append(
            (("at", "until"), f"until ({last}) is before from ({first}): the fault would never fire")
        )
    if "step" in at or "mtbf" in at:
        problems.append((("at", "every"), "every cannot go with step or mtbf: give one trigger"))
    return problems


def _steps(spec: FaultSpec, facts: ClusterFacts) -> list[int]:
    every = int(spec.at["every"])
    first, last = int(spec.at.get("from", every)), int(spec.at.get("until", facts.steps))
    return list(range(first, last + 1, every))


def _with_step(spec: FaultSpec, step: int) -> FaultSpec:
    rest = {k: v for k, v in spec.at.items() if k not in ("time", *EVERY_FIELDS)}
    # the stream key stays the entry as written: a repetition draws by its step, a timed fault by its time
    return dataclasses.replace(spec, at={**rest, "step": step}, origin=spec.origin or spec.content())


def as_step(spec: FaultSpec, facts: ClusterFacts) -> FaultSpec:
    """``spec`` as the kind sees it: an ``every`` trigger at its first step, a ``time`` trigger at
    step 1 (its step is known only in the run); any other trigger unchanged."""
    if "time" in spec.at:
        return _with_step(spec, 1)
    if "every" in spec.at:
        steps = _steps(spec, facts)
        return _with_step(spec, steps[0] if steps else 1)
    return spec


def _firings(spec: FaultSpec, facts: ClusterFacts) -> Iterator[tuple[str, FaultSpec, float | None]]:
    if "every" in spec.at:
        for step in _steps(spec, facts):
            yield f"@{step}", _with_step(spec, step), None
    elif "time" in spec.at:
        yield "", _with_step(spec, 1), parse_duration(spec.at["time"])
    else:
        yield "", spec, None


def plan_all(kind: FaultKind, spec: FaultSpec, seed: int, facts: ClusterFacts) -> list[PlannedFault]:
    """Every planned fault of one entry: one per firing of ``every``; a ``time`` trigger's fault
    with step 0 and ``params.at_time`` (the controller fires it at the first boundary at that time)."""
    out = []
    for suffix, one, at_time in _firings(spec, facts):
        fault = kind.plan(one, seed, facts)
        if at_time is not None:
            fault = dataclasses.replace(fault, step=0, params={**fault.params, "at_time": at_time})
        out.append(dataclasses.replace(fault, id=fault.id + suffix))
    return out


def due(fault: PlannedFault, step: int, now: Callable[[], float]) -> bool:
    """Whether ``fault`` fires at the boundary before ``step`` (``now()``: the virtual time there)."""
    at_time = fault.params.get("at_time")
    return fault.step == step if at_time is None else now() >= float(at_time)
