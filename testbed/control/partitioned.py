"""Ranks a partition keeps the controller from reaching: given up, replaced, and heard from at the heal.

A ``partition`` with ``cuts_control`` severs the control network too: the
controller cannot reach the ranks on the side away from it (it lives with
rank 0), so when the step fails it cannot end their processes. It declares
them lost, as their missing heartbeats would, and the recovery starts new
processes for their ranks while the old ones run on (zombies). Before that,
under ``policy.checkpoint.fencing: epoch``, the checkpoint storage's fence
rises to the epoch the restarted group will open. When the partition heals,
each zombie does what it would do (it commits its own version of the step
it was in) and the journal says whether the storage took it; then the
controller, which reaches it again, ends it.
"""

from __future__ import annotations

from typing import Any

from testbed.actors.outcome import is_death
from testbed.core.journal import Journal
from testbed.train import checkpoint as ckpt


class CutOff:
    """Lets a controller give up the ranks a partition cuts off from it (the controller mixes it in)."""

    state: Any
    scenario: Any
    cluster: Any
    journal: Journal
    epoch: int

    def detach_cut_off(self, step: int, out: dict[int, Any]) -> list[int]:
        """The ranks of ``out`` a partition keeps from the controller, each one's process given up
        (it runs on) and recorded as lost at the partition's start; the storage's fence raised first
        under ``fencing: epoch``. A rank whose process died anyway is a death, not a zombie."""
        cut = sorted(
            r
            for r, o in out.items()
            if r in self.state.cut_off and r not in self.state.zombies and not is_death(o.error)
        )
        if cut and self.scenario.policy.checkpoint.fencing == "epoch" and self.state.ckpt_root is not None:
            ckpt.raise_fence(self.state.ckpt_root, self.epoch + 1)
        for rank in cut:
            fault_id, t0 = self.state.cut_off[rank]
            record = self.cluster.detach(rank, t0, step)
            self.state.zombies[rank] = {**record, "fault": fault_id, "step": step}
        return cut


def zombies_return(state: Any, journal: Journal, fault_id: str, now: float) -> None:
    """``fault_id`` healed: the controller reaches its ranks again. Each zombie it left commits its own
    version of the step it was in (``zombie_write``: whether the storage took it), then is ended."""
    for rank in [r for r, (f, _) in state.cut_off.items() if f == fault_id]:
        del state.cut_off[rank]
    for rank, record in sorted(state.zombies.items()):
        if record["fault"] != fault_id:
            continue
        del state.zombies[rank]
        root = str(state.ckpt_root)
        ok, value = state.cluster.zombie_call(rank, "zombie_commit", root, int(record["step"]))
        if not ok:
            value = {"rank": rank, "step": record["step"], "landed": False, "error": str(value)}
        journal.emit("zombie_write", phase="main", fault=fault_id, pid=record["pid"], t=now, **value)
