"""The ``job`` section: the job a team really runs, which the rehearsal models.

::

    job: {model: llama3-70b, seq: 4096, global_batch: 1024, micro_batch: 1}

The layout is the workload's ``parallel`` and the NPU the cluster's preset;
:meth:`JobSection.job` puts them together into a :class:`testbed.job.spec.Job`.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.job.models import MODELS
from testbed.job.spec import RECOMPUTE, Job
from testbed.scenario.fields import choice, custom, flag, integer, number
from testbed.topology.layout import Layout
from testbed.topology.presets import Preset


@dataclass(frozen=True)
class JobSection:
    """``job``: the modelled model, its data per step, its recomputation and its efficiency."""

    model: str = choice("llama3-8b", lambda: MODELS, "model", "a named model (testbed.job.models)")
    seq: int = integer(4096, 1, 2**20, "tokens per sample")
    global_batch: int = integer(512, 1, 2**24, "samples per step, over every data-parallel replica")
    micro_batch: int = integer(1, 1, 2**16, "samples per micro-batch")
    efficiency: float | None = number(
        None, 0.01, 1.0, "fraction of peak FLOPs while computing (default: the NPU preset's)", optional=True
    )
    recompute: str = choice("selective", lambda: RECOMPUTE, "recomputation", "none, selective or full")
    distributed_optimizer: bool = flag(True, "optimizer state sharded over the data-parallel replicas")
    stages: tuple[int, ...] = custom(
        (),
        "stages",
        lambda: {"type": "array", "items": {"type": "integer", "minimum": 1}},
        "layers of each pipeline stage, first to last (default: as even as it goes)",
    )

    def job(self, layout: Layout, npu: Preset) -> Job:
        """The job on ``layout`` and ``npu``."""
        return Job(
            model=MODELS[self.model],
            seq=self.seq,
            global_batch=self.global_batch,
            micro_batch=self.micro_batch,
            layout=layout,
            npu=npu,
            efficiency=self.efficiency or npu.efficiency,
            recompute=self.recompute,
            distributed_optimizer=self.distributed_optimizer,
            stages=self.stages,
        )
