"""A rank's process that a partition cut off from the controller, that was replaced, and runs on.

A mixin of :class:`testbed.train.npu.NPU`. The controller could not reach the
process, declared it lost and started another for its rank; this one never
heard. When the partition heals it does what a split-brain survivor does: it
ends the step it was in on its own (its own gradient, never synchronised)
and publishes that state as the checkpoint of the step, with the group
epoch it last knew. Only a fence in the storage (an epoch that rose when
the rank was replaced) keeps that write from becoming a second history of
the step.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from testbed.collectives import Endpoint
from testbed.core.errors import CheckpointError
from testbed.train import checkpoint as ckpt


class RankZombie:
    """What a cut-off, replaced process does once it can reach the storage again."""

    rank: int
    ep: Endpoint
    workload: Any
    _pending: Any  # the failed step's forward and backward (NPU)

    def zombie_commit(self, root: str, step: int) -> dict[str, Any]:
        """End ``step`` with this rank's own gradient, then commit it as ``step``'s checkpoint: the
        newest committed checkpoint's files for the other ranks, this rank's state for its own, and
        this process's epoch as the commit's fencing token. Returns what it wrote and whether the
        storage took it."""
        pending, self._pending = self._pending, None
        if pending is not None and pending.step == step:
            self.workload.apply(pending.ctx, pending.grads)
        base, epoch = Path(root), self.ep.dataplane.epoch
        found, _ = ckpt.newest(base)
        tmp = ckpt.step_dir(base, step, tmp=True)
        shutil.rmtree(tmp, ignore_errors=True)
        if found is not None:
            shutil.copytree(found.path, tmp)
            (tmp / ckpt.MANIFEST).unlink()
            shutil.rmtree(tmp / f"rank_{self.rank:05d}", ignore_errors=True)
        manifest: dict[str, Any] = dict(found.manifest) if found is not None else {"ranks": {}}
        comps = {c: self.workload.state(c) for c in manifest.get("include", self.workload.components)}
        ranks = {**manifest["ranks"], str(self.rank): ckpt.write_shard(tmp, self.rank, comps)}
        manifest.update(step=step, ranks=ranks, zombie=self.rank)
        out = {"rank": self.rank, "step": step, "epoch": epoch, "digest": self.workload.params_digest()}
        try:
            path = ckpt.commit(base, step, manifest, epoch=epoch)
        except CheckpointError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            return {**out, "landed": False, "refused": exc.message}
        return {**out, "landed": True, "path": str(path), "base_step": found.step if found else None}
