"""``testbed estimate`` for serving: throughput per NPU and latency at a batch size.

From a :class:`~testbed.serve.cost.Deployment` alone: one decode step (the
time per output token) at the batch and context the team runs, the largest
batch that keeps it under the SLO's TPOT, the time to first token of one
prompt, and how many tokens of KV cache fit in what the weights leave of
each NPU's memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.job.figures import gib
from testbed.serve import cost
from testbed.serve.cost import DecodePoint, Deployment, PassTime


@dataclass(frozen=True)
class ServeEstimate:
    """The analytic figures of one serving instance."""

    deployment: Deployment
    context: int
    prompt: int
    decode: DecodePoint
    prefill: PassTime
    tpot_slo_s: float
    under_slo: DecodePoint | None

    @property
    def weight_bytes(self) -> float:
        """Bytes of weights each NPU holds (every local expert)."""
        dep = self.deployment
        return dep.weights_per_npu(float("inf")) * dep.weight_bytes

    @property
    def kv_tokens(self) -> int:
        """Tokens of KV cache that fit in what the weights leave of one NPU's memory."""
        dep = self.deployment
        return max(0, int((dep.npu.hbm_bytes - self.weight_bytes) // dep.kv_bytes_per_token()))

    @property
    def ttft_s(self) -> float:
        """Time to first token of one prompt on an idle NPU: its prefill."""
        return self.prefill.total_s


def serve_estimate(
    dep: Deployment, batch: int, context: int, prompt: int, tpot_slo_s: float
) -> ServeEstimate:
    """The figures of ``dep`` decoding ``batch`` requests per NPU at ``context`` tokens each, a
    prompt of ``prompt`` tokens, and the largest batch under ``tpot_slo_s``."""
    return ServeEstimate(
        deployment=dep,
        context=context,
        prompt=prompt,
        decode=DecodePoint(batch, cost.decode_step(dep, batch, context)),
        prefill=cost.prefill(dep, (prompt,)),
        tpot_slo_s=tpot_slo_s,
        under_slo=cost.best_batch_under(dep, tpot_slo_s, context),
    )


def _pass(p: PassTime) -> str:
    return (
        f"compute {p.compute_s * 1e3:.2f} ms, HBM {p.memory_s * 1e3:.2f} ms ({p.bound} bound), "
        f"collectives {p.comm_s * 1e3:.2f} ms"
    )


def render(e: ServeEstimate) -> str:
    """The serving estimate as text."""
    dep, m = e.deployment, e.deployment.model
    d, slo = e.decode, e.under_slo
    best = (
        f"batch {slo.batch} per NPU: TPOT {slo.step.total_s * 1e3:.1f} ms, "
        f"{slo.tokens_per_s:,.0f} tokens/s per NPU"
        if slo
        else "none: one request alone takes longer"
    )
    return "\n".join(
        [
            f"serving: {m.name} ({m.active_params() / 1e9:.1f}B per token) on {dep.npus} NPUs of "
            f"{dep.npu.name}, TP {dep.tp}, experts over all {dep.npus}; weights {dep.precision}, "
            f"KV cache {dep.kv_precision}; efficiency {dep.efficiency:.2f} of "
            f"{dep.flops / dep.efficiency / 1e12:.0f} TFLOPs, HBM {dep.hbm_efficiency:.2f} of "
            f"{dep.npu.hbm_Bps / 1e12:.1f} TB/s",
            f"decode at batch {d.batch} per NPU, context {e.context}: TPOT {d.step.total_s * 1e3:.1f} ms, "
            f"{d.tokens_per_s:,.0f} tokens/s per NPU",
            f"  {_pass(d.step)}",
            f"largest batch under a {e.tpot_slo_s * 1e3:.0f} ms TPOT: {best}",
            f"prefill of a {e.prompt}-token prompt: TTFT {e.ttft_s * 1e3:.1f} ms, "
            f"{e.prompt / e.ttft_s:,.0f} tokens/s per NPU",
            f"  {_pass(e.prefill)}",
            f"memory per NPU: weights {gib(e.weight_bytes)} of {gib(dep.npu.hbm_bytes)}; KV cache room "
            f"{e.kv_tokens:,} tokens ({e.kv_tokens // max(1, e.context)} requests at context {e.context})",
        ]
    )
