"""What serving a model costs on the job model's hardware: a decode step and a prefill.

A decode step of a batch reads every weight an NPU holds once and every
cached token of its requests once, and computes two FLOPs per weight per
token plus the attention over each request's context: it is bound by HBM
bandwidth at small batches and by compute at large ones (the roofline,
Williams et al. 2009). Prefill is the same forward pass over a whole prompt
at once, compute-bound. The tensor-parallel allreduces (two per layer,
Megatron-LM) and the expert-parallel dispatch and combine (two per MoE
layer, GShard) come on top, timed by the fabric's closed forms; nothing is
overlapped.

A :class:`Deployment` is one serving instance as its team writes it down:
"DeepSeek-R1 in INT8 on 160 NPUs, attention data-parallel, EP 160".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from testbed.collectives import closed_form
from testbed.job.models import ModelShape
from testbed.topology.presets import Preset, Topology

#: Bytes per weight and the matmul rate relative to the preset's BF16 peak, by precision. Ascend
#: and NVIDIA parts alike double their dense rate from 16-bit to INT8 (910B: 313 TFLOPS FP16, 626
#: TOPS INT8, Huawei's Atlas 800T A2 datasheet; H100 SXM: 989 and 1,979, NVIDIA's datasheet).
PRECISIONS = {"bf16": (2, 1.0), "int8": (1, 2.0)}
#: Bytes of one activation value crossing the fabric (BF16).
ACTIVATION_BYTES = 2
#: Share of the HBM's peak bandwidth a decode step's streaming reads reach: an assumption, not a
#: fit (memory-bound kernels commonly reach 80 to 90 % of the datasheet figure).
HBM_EFFICIENCY = 0.8


@dataclass(frozen=True)
class Deployment:
    """One serving instance: a model on ``npus`` NPUs of ``npu``, attention heads and dense
    weights split ``tp`` ways (the rest of the NPUs run attention data-parallel), routed experts
    spread over all ``npus`` (expert parallel)."""

    model: ModelShape
    npu: Preset
    npus: int = 1
    tp: int = 1
    precision: str = "bf16"
    kv_precision: str = "bf16"
    #: share of the compute peak a kernel reaches (the job model's ``efficiency``)
    efficiency: float = 0.4
    hbm_efficiency: float = HBM_EFFICIENCY

    @property
    def weight_bytes(self) -> int:
        """Bytes of one weight."""
        return PRECISIONS[self.precision][0]

    @property
    def flops(self) -> float:
        """FLOPs per second one NPU's kernels reach at this precision."""
        return self.npu.peak_flops * PRECISIONS[self.precision][1] * self.efficiency

    @property
    def topology(self) -> Topology:
        """Where the instance's NPUs sit: one supernode of the preset, as many as fit."""
        per = min(self.npus, self.npu.max_npus_per_supernode)
        return Topology(self.npu, -(-self.npus // per), per)

    def activation_bytes_per_token(self) -> int:
        """Bytes of the widest activation one token holds in a forward pass on one NPU: its hidden
        state and its feed-forward's gate and up projections (SwiGLU; the routed experts' ``top_k``
        of them), over TP, in BF16."""
        m = self.model
        ffn = max(m.ffn, m.expert_ffn * m.top_k)
        return int((m.hidden + 2 * ffn / self.tp) * ACTIVATION_BYTES)

    def kv_bytes_per_token(self) -> float:
        """Cache bytes one token of a request costs the NPU that serves its attention: under
        grouped-query attention the KV heads split over TP; a latent cache is whole on each."""
        m = self.model
        split = 1 if m.latent is not None else min(self.tp, m.kv_heads)
        return m.kv_values_per_token() * PRECISIONS[self.kv_precision][0] / split

    def weights_per_npu(self, tokens: float) -> float:
        """Weights one NPU reads in a forward pass of ``tokens`` tokens per NPU: the dense ones
        (attention, dense and shared feed-forward, embeddings) over TP, and of its
        ``ceil(experts / npus)`` routed experts per layer those any token of the instance picks
        (uniform routing: each is missed with probability ``(1 - k / E) ^ (tokens npus)``)."""
        m = self.model
        routed = m.moe_layers * m.experts * m.expert_params()
        dense = (m.params() - routed) / self.tp
        if not m.experts:
            return dense
        local = math.ceil(m.experts / self.npus)
        touched = 1 - (1 - m.top_k / m.experts) ** (tokens * self.npus)
        return dense + m.moe_layers * local * touched * m.expert_params()

    def matmul_flops_per_token(self) -> float:
        """Forward FLOPs of one token's matmuls: two per weight it goes through, the input
        embedding lookup excluded (PaLM, Chowdhery et al. 2022, Appendix B)."""
        m = self.model
        return 2.0 * (m.active_params() - m.vocab * m.hidden)

    def attention_flops(self, context: float, absorbed: bool = True) -> float:
        """Forward FLOPs of one token attending over ``context`` cached tokens: ``Q K^T`` and the
        weighted sum of ``V``, ``4 L H Q T`` (PaLM's attention term, forward third). A latent
        cache is attended in its compressed form, the up-projections absorbed into the query and
        output (DeepSeek-V2 technical report, section 2.1.3; FlashMLA's 576-wide keys, 512-wide
        values): ``2 L H (2 c + r) T`` for latent rank ``c`` and RoPE width ``r``; prefill, compute
        bound, expands it to full heads instead (``absorbed=False``)."""
        m = self.model
        if m.latent is not None and absorbed:
            width = 2 * m.latent.kv_rank + m.latent.rope_dim
            return 2.0 * m.layers * m.heads * width * context
        return 4.0 * m.layers * m.heads * m.q_dim * context

    def comm_split(self, tokens: float) -> tuple[float, float]:
        """(latency, transfer) seconds of the forward pass's collectives for ``tokens`` tokens per
        NPU: two TP allreduces per layer (Shoeybi et al. 2019), dispatch and combine per MoE layer
        (GShard, Lepikhin et al. 2020), each ``top_k`` copies of a token's hidden state. The
        transfer part is what a link shared with other traffic stretches."""
        m, topo = self.model, self.topology
        act = tokens * m.hidden * ACTIVATION_BYTES
        latency = transfer = 0.0
        if self.tp > 1:
            _, lat, tra = closed_form.split_s("allreduce", list(range(self.tp)), topo, act)
            latency, transfer = latency + 2 * m.layers * lat, transfer + 2 * m.layers * tra
        if m.experts and self.npus > 1:
            _, lat, tra = closed_form.split_s("alltoall", list(range(self.npus)), topo, act * m.top_k)
            latency, transfer = latency + 2 * m.moe_layers * lat, transfer + 2 * m.moe_layers * tra
        return latency, transfer

    def comm_s(self, tokens: float) -> float:
        """Seconds of the forward pass's collectives for ``tokens`` tokens per NPU (:meth:`comm_split`)."""
        return sum(self.comm_split(tokens))


@dataclass(frozen=True)
class PassTime:
    """One forward pass on one NPU: its compute, its HBM reads and its collectives (seconds)."""

    compute_s: float
    memory_s: float
    comm_s: float
    #: the part of ``comm_s`` that moves bytes (the rest is latency)
    transfer_s: float = 0.0

    @property
    def total_s(self) -> float:
        """The pass: the slower of compute and memory (the roofline), then the collectives."""
        return max(self.compute_s, self.memory_s) + self.comm_s

    @property
    def bound(self) -> str:
        """What limits the pass: ``compute`` or ``memory``."""
        return "compute" if self.compute_s >= self.memory_s else "memory"


def decode_step(dep: Deployment, batch: int, context: float) -> PassTime:
    """One decode step of ``batch`` requests on one NPU, each attending over ``context`` cached
    tokens on average: one token each."""
    flops = batch * (dep.matmul_flops_per_token() + dep.attention_flops(context)) / dep.tp
    nbytes = dep.weights_per_npu(batch) * dep.weight_bytes + batch * context * dep.kv_bytes_per_token()
    return _pass(dep, flops, nbytes, batch)


def prefill(dep: Deployment, prompts: tuple[int, ...]) -> PassTime:
    """One prefill of ``prompts`` (their token counts) on one NPU: every token's matmuls, each
    prompt's causal attention (``n^2 / 2`` pairs), the weights read once and the new cache
    written."""
    tokens = sum(prompts)
    attention = sum(dep.attention_flops(n / 2, absorbed=False) * n for n in prompts)
    flops = tokens * dep.matmul_flops_per_token() + attention
    nbytes = dep.weights_per_npu(tokens) * dep.weight_bytes + tokens * dep.kv_bytes_per_token()
    return _pass(dep, flops / dep.tp, nbytes, tokens)


def _pass(dep: Deployment, flops: float, nbytes: float, tokens: float) -> PassTime:
    latency, transfer = dep.comm_split(tokens)
    hbm = dep.npu.hbm_Bps * dep.hbm_efficiency
    return PassTime(flops / dep.flops, nbytes / hbm, latency + transfer, transfer)


@dataclass(frozen=True)
class DecodePoint:
    """Decode at one batch size: its step (the TPOT) and the tokens per second per NPU."""

    batch: int
    step: PassTime

    @property
    def tokens_per_s(self) -> float:
        """Tokens one NPU generates per second."""
        return self.batch / self.step.total_s


def best_batch_under(dep: Deployment, tpot_s: float, context: float, limit: int = 4096) -> DecodePoint | None:
    """The largest batch per NPU whose decode step stays under ``tpot_s`` at ``context``, and what
    it yields; ``None`` when even one request cannot. Steps grow with the batch, so a bisection."""
    if decode_step(dep, 1, context).total_s > tpot_s:
        return None
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if decode_step(dep, mid, context).total_s <= tpot_s:
            lo = mid
        else:
            hi = mid - 1
    return DecodePoint(lo, decode_step(dep, lo, context))
