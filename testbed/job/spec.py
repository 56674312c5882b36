"""The modelled job: a model, its data per step, its precision, its layout, its hardware.

A :class:`Job` is what a team would write down about the run it rehearses:
"llama3-70b, sequence 4096, global batch 1024, TP 8 x PP 4 x DP 16 on 512
NPUs". Everything the testbed times or sizes for that job derives from it
(:mod:`testbed.job.figures`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from testbed.job.models import ModelShape
from testbed.topology.layout import Layout
from testbed.topology.presets import Preset

#: Bytes per parameter of mixed-precision Adam (ZeRO, Rajbhandari et al. 2020, section 3.1):
#: BF16 weights 2, FP32 main gradients 4 (Megatron-LM accumulates them in FP32), FP32 master
#: weights, momentum and variance 4 + 4 + 4.
WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 4, 12
#: Bytes of one activation value (BF16).
ACTIVATION_BYTES = 2

#: Recomputation: ``none`` keeps every activation; ``selective`` recomputes attention's
#: ``s^2`` part (as FlashAttention does); ``full`` keeps only each layer's input.
RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class Job:
    """One training job as its team describes it."""

    model: ModelShape
    seq: int
    global_batch: int
    micro_batch: int
    layout: Layout
    npu: Preset
    efficiency: float
    recompute: str = "selective"
    #: shard the optimizer state over the data-parallel replicas (Megatron's distributed optimizer)
    distributed_optimizer: bool = True
    #: layers of each pipeline stage (empty: as even as it goes, the remainder on the first stages)
    stages: tuple[int, ...] = field(default=())
    #: model chunks per pipeline rank: 1 is plain 1F1B, more the interleaved schedule (Narayanan et
    #: al. 2021, section 2.2.2), which cuts the bubble ``v``-fold for ``v`` times the sends
    virtual_stages: int = 1
    #: the job's own cluster, (supernodes, NPUs per supernode) of its preset; empty: as many of the
    #: preset's real supernodes as it fills (:func:`testbed.job.figures.job_topology`)
    cluster: tuple[int, ...] = field(default=())

    @property
    def world(self) -> int:
        """NPUs the job runs on."""
        return self.layout.world

    @property
    def replicas(self) -> int:
        """Ranks that read different samples (data and expert parallel)."""
        return self.layout.dp * self.layout.ep

    @property
    def micro_batches(self) -> int:
        """Micro-batches each pipeline runs per step (``m``)."""
        return max(1, self.global_batch // (self.micro_batch * self.replicas))

    @property
    def tokens_per_step(self) -> int:
        """Tokens the job trains on per step."""
        return self.global_batch * self.seq

    def stage_layers(self) -> tuple[int, ...]:
        """Transformer layers of each pipeline stage."""
        if self.stages:
            return self.stages
        pp, layers = self.layout.pp, self.model.layers
        return tuple(layers // pp + (1 if i < layers % pp else 0) for i in range(pp))
