"""After the main phase, the yardsticks it is measured by: the reference run and the probe.

- the reference: the same seed again from step 1, uninterrupted, when the main
  phase needed a recovery or its data may have gone wrong (a recovery's alone is
  skipped, and journalled so, when the scenario says ``expect.reference_run:
  false``); every rank then
  says how far its final state is from the reference's
  (:mod:`testbed.control.divergence`), and runs that share one run it once
  (:mod:`testbed.control.shared_reference`);
- the probe: when the main phase never resumed from a checkpoint, a resume
  from its newest committed checkpoint before the last step, to prove what
  it restores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testbed.control import divergence
from testbed.control.shared_reference import reference_key
from testbed.control.state import PhaseState
from testbed.core.journal import Journal
from testbed.integrity.inspector import corrupted
from testbed.train import checkpoint as ckpt


class Yardsticks:
    """Runs the reference and the probe after the main phase (the controller mixes it in)."""

    scenario: Any
    cluster: Any
    journal: Journal
    faults: Any
    shrunk: Any
    epoch: int
    ckpt_dir: Path
    recoveries: list[Any]
    active_ranks: Any
    open_group: Any
    _phase: Any

    def yardsticks(self) -> None:
        """The reference when the main phase needed it, the probe when it never resumed."""
        if corrupted(self.journal.events):  # the truth needs its yardstick, whatever the scenario says
            self.against_uninterrupted()
        elif self.recoveries:
            if self.scenario.expect.reference_run is False:
                self.journal.emit("reference_skipped", reason="expect.reference_run is false")
            else:
                self.against_uninterrupted()
        if not any(r.resumed for r in self.recoveries):
            self._probe()  # main never resumed from a checkpoint: prove the checkpoint another way

    def against_uninterrupted(self) -> None:
        """Run (or replay) the reference run, and journal how far the main phase ended from it."""
        ranks = self.active_ranks()
        key = reference_key(self.scenario, ranks)
        divergence.against_reference(self.cluster, self.journal, ranks, self._reference, key)

    def _clear_faults(self) -> None:
        """No fault in force any more; the ranks' own knobs (a silent corruption's too) go with
        ``fresh_job``, so the yardstick runs on healthy NPUs."""
        self.shrunk = None
        self.faults.clear()

    def _reference(self, replayed: bool) -> int:
        """Run the reference as a fresh job (``replayed``: only take the epoch it opens); its epoch."""
        self._clear_faults()
        if replayed:  # another run's, the same: the epoch of its group is this run's next one all the same
            self.epoch += 1
            return self.epoch
        self.cluster.call_ok("fresh_job", 0.0)
        self.open_group(0.0, fresh=True)
        self._phase(PhaseState("reference", [], None), 1)
        return self.epoch

    def _probe(self) -> None:
        loadable, _ = ckpt.newest(self.ckpt_dir, before=self.scenario.workload.steps)
        if loadable is None:
            self.journal.emit("probe_skipped", reason="no committed checkpoint before the last step")
            return
        self._clear_faults()
        self.cluster.call_ok("fresh_job", 0.0)
        t = self.open_group(0.0, fresh=True)
        restore = self.scenario.policy.checkpoint.restore
        self.cluster.call_ok("restore", per_rank=lambda r: (loadable.files_of(r, restore),))
        self.journal.emit(
            "resume",
            phase="probe",
            from_step=loadable.step,
            t=t,
            components={str(r): sorted(loadable.files_of(r, restore)) for r in self.cluster.npus},
        )
        self._phase(PhaseState("probe", [], None), loadable.step + 1)
