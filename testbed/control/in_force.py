"""What a resumed run puts back: the faults still in force when the controller died, and the
Poisson arrivals where they had got to.

A controller's death takes its NPU processes with it, and with them every
fault that lived in them (a slowed rank, a degraded link's records, pinned
memory). The hardware those faults stand for is still as it was, so a resume
puts each back until the end it had: a fault whose window (virtual time) or
span (steps) had not run out, and a link fault for good, none of them healed
in the journal. A fault that ends a process, or acts on a checkpoint, acted
once and is never put back. Poisson processes (``mtbf``) start again from
the seed and skip the arrivals the journal says fired, so their later
arrivals are the ones the run would have drawn.
"""

from __future__ import annotations

from typing import Any

from faults.arrivals import Arrivals
from faults.kind import PlannedFault, kinds
from testbed.control.injection import FaultSchedule


def _in_force(prior: list[dict[str, Any]], t_lost: float, step: int) -> list[dict[str, Any]]:
    """The ``fault_injected`` events of the main phase whose fault was in force at ``t_lost``."""
    healed = {e.get("id") for e in prior if e.get("event") == "fault_healed"}
    registry, out = kinds(), []
    for e in prior:
        if e.get("event") != "fault_injected" or e.get("phase") != "main" or e.get("id") in healed:
            continue
        kind, record = registry.get(str(e.get("kind"))), e.get("record") or {}
        if kind is None or kind.ends_process or kind.acts_on_checkpoint or record.get("skipped"):
            continue
        t_end, heal_step = record.get("t_end"), record.get("heal_step")
        lasting = (t_end is not None and float(t_end) > t_lost) or (
            heal_step is not None and heal_step > step
        )
        for_good = kind.acts_on_links and "t_end" in record and t_end is None and record.get("t0") is not None
        if lasting or for_good:
            out.append(e)
    return out


def restore_in_force(schedule: FaultSchedule, prior: list[dict[str, Any]], t_lost: float, step: int) -> None:
    """Put back each fault in force when the controller died (``fault_restored``), to heal when it
    would have: at its window's end, or after its span of steps."""
    registry = kinds()
    for e in _in_force(prior, t_lost, step):
        where = (int(e["rank"]), int(e["step"]), str(e["point"]))
        fault = PlannedFault(str(e["id"]), str(e["kind"]), *where, params=dict(e["params"]))
        registry[fault.kind].inject(schedule.injector, fault)
        record = e["record"]
        schedule.keep_until_healed(fault, record)
        schedule.journal.emit(
            "fault_restored",
            phase="main",
            id=fault.id,
            kind=fault.kind,
            t=schedule.injector.now(),
            until=record.get("t_end"),
            heal_step=record.get("heal_step"),
        )


def rearmed(plan: list[PlannedFault], seed: int, prior: list[dict[str, Any]]) -> list[Arrivals]:
    """The plan's Poisson processes, each past the arrivals the journal says fired (the same draws,
    in the same order, as the run made)."""
    out = []
    for fault in (f for f in plan if "mtbf" in f.params):
        process = Arrivals.start(fault, seed)
        mine = f"{fault.id}#"
        fired = sum(
            1 for e in prior if e.get("event") == "fault_injected" and str(e.get("id")).startswith(mine)
        )
        while process.count < fired:
            process.due(process.next_t, 0)
        out.append(process)
    return out
