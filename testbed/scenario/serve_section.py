"""The ``serve`` section: the serving deployment a team really runs, which the rehearsal models.

::

    serve:
      model: deepseek-v3-671b
      npus: 160            # NPUs of one instance (modelled)
      precision: int8
      batch: 96            # requests per NPU in a decode step
      context: 4096        # cached tokens per request, for the estimate
      slo: {ttft: 2s, tpot: 50ms}

The NPU is the cluster's preset. :meth:`ServeSection.deployment` puts them
together into a :class:`testbed.serve.cost.Deployment` (docs/serving.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.job.models import MODELS
from testbed.scenario.fields import choice, integer, number, seconds, section
from testbed.serve.cost import HBM_EFFICIENCY, PRECISIONS, Deployment
from testbed.topology.presets import Preset


@dataclass(frozen=True)
class ServiceLevel:
    """``slo``: the latency a serving team promises."""

    ttft_s: float = seconds(2.0, 0.0, doc="time to first token", key="ttft")
    tpot_s: float = seconds(0.05, 0.0, doc="time per output token after the first", key="tpot")


@dataclass(frozen=True)
class ServeSection:
    """``serve``: the modelled model, its instance, its precision, its batch and its SLO."""

    model: str = choice("llama3-8b", lambda: MODELS, "model", "a named model (testbed.job.models)")
    npus: int = integer(1, 1, 2**20, "NPUs of one serving instance (experts spread over all of them)")
    tp: int = integer(1, 1, 1024, "tensor-parallel degree of attention and the dense weights")
    precision: str = choice("bf16", lambda: PRECISIONS, "precision", "of the weights: bf16 or int8")
    kv_precision: str = choice("bf16", lambda: PRECISIONS, "precision", "of the KV cache: bf16 or int8")
    efficiency: float | None = number(
        None, 0.01, 1.0, "fraction of peak FLOPs while computing (default: the NPU preset's)", optional=True
    )
    hbm_efficiency: float = number(HBM_EFFICIENCY, 0.01, 1.0, "fraction of peak HBM bandwidth a read reaches")
    batch: int = integer(32, 1, 2**16, "requests per NPU in one decode step")
    context: int = integer(4096, 1, 2**22, "cached tokens per request in a decode step (the estimate's)")
    prompt: int = integer(2048, 1, 2**22, "tokens of a prompt (the estimate's time to first token)")
    slo: ServiceLevel = section(ServiceLevel, "the service level: ttft, tpot")

    def deployment(self, npu: Preset) -> Deployment:
        """The instance on ``npu``."""
        return Deployment(
            model=MODELS[self.model],
            npu=npu,
            npus=self.npus,
            tp=self.tp,
            precision=self.precision,
            kv_precision=self.kv_precision,
            efficiency=self.efficiency or npu.efficiency,
            hbm_efficiency=self.hbm_efficiency,
        )
