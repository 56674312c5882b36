"""Whether each injected fault took effect: a pure function of the journal.

Without this, a run whose fault changed nothing (a degraded link no collective
uses, a set-up delay after every link is up) passes, and its user believes
the fault was rehearsed. :func:`fault_effects` asks each fault's kind what it
did (:meth:`faults.kind.FaultKind.effect`, reading
:class:`faults.evidence.Evidence`); the run journals the answers
(``fault_effects``) and the summary's fault table shows them.
"""

from __future__ import annotations

from faults.evidence import Effect, Event, Evidence
from faults.kind import kinds


def fault_effects(events: list[Event]) -> dict[str, Effect]:
    """Each fault fired in the main phase (by id): what it did, or why it did nothing."""
    registry, evidence = kinds(), Evidence(events)
    out: dict[str, Effect] = {}
    for fired in evidence.events:
        if fired.get("event") != "fault_injected":
            continue
        skipped = fired.get("record", {}).get("skipped")
        kind = registry.get(str(fired.get("kind")))
        if skipped:
            out[fired["id"]] = Effect(False, str(skipped))
        elif kind is not None:
            effect = kind.effect(fired, evidence)
            if effect is not None:
                out[fired["id"]] = effect
    return out
