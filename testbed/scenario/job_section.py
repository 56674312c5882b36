"""The ``job`` section: the job a team really runs, which the rehearsal models.

::

    job: {model: llama3-70b, seq: 4096, global_batch: 1024, micro_batch: 1}

The NPU is the cluster's preset, and the layout the workload's ``parallel``
unless ``parallel`` here names a larger one: a job of 16,384 NPUs rehearsed by
the few the cluster has (modelled scale, docs/job.md).
:meth:`JobSection.job` puts them together into a :class:`testbed.job.spec.Job`.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.job.models import MODELS
from testbed.job.spec import RECOMPUTE, Job
from testbed.scenario.fields import choice, custom, flag, integer, layout_schema, number
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
    virtual_stages: int = integer(
        1, 1, 64, "model chunks per pipeline rank: 1 is plain 1F1B, more the interleaved schedule"
    )

    parallel: tuple[int, ...] = custom(
        (),
        "job_layout",
        lambda: layout_schema("the modelled job's"),
        "the modelled job's layout {dp, tp, pp, ep}, when larger than the NPUs that run it (default: the "
        "workload's)",
    )
    cluster: tuple[int, ...] = custom(
        (),
        "job_cluster",
        lambda: {
            "type": "object",
            "properties": {
                "supernodes": {"type": "integer", "minimum": 1, "description": "supernodes of the job"},
                "npus_per_supernode": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "NPUs of each (at most the preset's)",
                },
            },
            "required": ["supernodes", "npus_per_supernode"],
            "additionalProperties": False,
        },
        "the job's own cluster {supernodes, npus_per_supernode} of the preset (default: as many of the "
        "preset's real supernodes as the job fills)",
    )

    def layout(self, run: Layout) -> Layout:
        """The modelled job's layout: ``parallel``, or the layout the NPUs run (``run``)."""
        if not self.parallel:
            return run
        dp, tp, pp, ep = self.parallel
        return Layout(dp=dp, tp=tp, pp=pp, ep=ep)

    def job(self, layout: Layout, npu: Preset) -> Job:
        """The job on ``npu``, laid out as ``parallel`` says or else as ``layout`` (the workload's)."""
        return Job(
            model=MODELS[self.model],
            seq=self.seq,
            global_batch=self.global_batch,
            micro_batch=self.micro_batch,
            layout=self.layout(layout),
            npu=npu,
            efficiency=self.efficiency or npu.efficiency,
            recompute=self.recompute,
            distributed_optimizer=self.distributed_optimizer,
            stages=self.stages,
            virtual_stages=self.virtual_stages,
            cluster=self.cluster,
        )
