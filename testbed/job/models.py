"""Model shapes: parameter counts and FLOPs per token of the models teams train, with sources.

A :class:`ModelShape` is a decoder-only transformer: grouped-query attention
(or DeepSeek's multi-head latent attention, :class:`LatentAttention`), a
SwiGLU feed-forward, optionally mixture-of-experts layers after some dense
ones, and untied input and output embeddings. Norm weights (two vectors of
``hidden`` per layer, one at the end) are counted; biases there are none.

FLOPs per token for training follow PaLM (Chowdhery et al. 2022, Appendix
B): ``6 N + 12 L H Q T``, with ``N`` the parameters a token activates
(embedding lookups are no matmuls, so the input embedding is left out),
``L`` layers, ``H`` heads of width ``Q`` and ``T`` the sequence length.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class LatentAttention:
    """Multi-head latent attention (DeepSeek-V2/V3): queries and keys/values through low-rank
    projections, a decoupled RoPE part of each head."""

    q_rank: int
    kv_rank: int
    nope_dim: int
    rope_dim: int
    v_dim: int

    def params(self, hidden: int, heads: int) -> int:
        """Weights of one layer's attention (the two low-rank norms included)."""
        q = hidden * self.q_rank + self.q_rank + self.q_rank * heads * (self.nope_dim + self.rope_dim)
        kv = hidden * (self.kv_rank + self.rope_dim) + self.kv_rank
        kv += self.kv_rank * heads * (self.nope_dim + self.v_dim)
        return q + kv + heads * self.v_dim * hidden


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's shape; ``experts > 0`` makes every layer after the first
    ``dense_layers`` a mixture of experts (``top_k`` routed of ``experts``, plus ``shared``)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    head_dim: int = 0
    experts: int = 0
    top_k: int = 0
    shared: int = 0
    expert_ffn: int = 0
    dense_layers: int = 0
    latent: LatentAttention | None = None
    source: str = ""

    @property
    def q_dim(self) -> int:
        """Width of one attention head."""
        return self.head_dim or self.hidden // self.heads

    @property
    def moe_layers(self) -> int:
        """Layers whose feed-forward is a mixture of experts."""
        return self.layers - self.dense_layers if self.experts else 0

    def attention_params(self) -> int:
        """Weights of one layer's attention."""
        if self.latent is not None:
            return self.latent.params(self.hidden, self.heads)
        q = self.heads * self.q_dim
        kv = self.kv_heads * self.q_dim
        return self.hidden * (q + 2 * kv) + q * self.hidden

    def expert_params(self) -> int:
        """Weights of one expert (a SwiGLU of ``expert_ffn``)."""
        return 3 * self.hidden * self.expert_ffn

    def layer_params(self, moe: bool) -> int:
        """Weights of one layer (dense or mixture of experts), its two norms included."""
        if moe:
            ffn = (self.experts + self.shared) * self.expert_params() + self.experts * self.hidden
        else:
            ffn = 3 * self.hidden * self.ffn
        return self.attention_params() + ffn + 2 * self.hidden

    def embedding_params(self) -> int:
        """Input and output embeddings (untied) and the final norm."""
        return 2 * self.vocab * self.hidden + self.hidden

    def params(self) -> int:
        """All weights."""
        dense = self.layers - self.moe_layers
        return (
            dense * self.layer_params(False)
            + self.moe_layers * self.layer_params(True)
            + self.embedding_params()
        )

    def active_params(self) -> int:
        """Weights one token goes through (routed experts: ``top_k`` of them)."""
        idle = (self.experts - self.top_k) * self.expert_params()
        return self.params() - self.moe_layers * idle

    def kv_values_per_token(self) -> int:
        """Values the KV cache keeps per token, over all layers: a key and a value per KV head
        under grouped-query attention (``2 L K Q``); under latent attention the compressed
        key-value and the decoupled RoPE key, ``L (kv_rank + rope_dim)`` (DeepSeek-V2 technical
        report, section 2.1: what multi-head latent attention caches; 512 + 64 in V3's shape)."""
        if self.latent is not None:
            return self.layers * (self.latent.kv_rank + self.latent.rope_dim)
        return 2 * self.layers * self.kv_heads * self.q_dim

    def flops_per_token(self, seq: int) -> float:
        """Training FLOPs (forward and backward) per token at sequence length ``seq`` (PaLM)."""
        matmul = self.active_params() - self.vocab * self.hidden  # the input lookup is no matmul
        return 6.0 * matmul + 12.0 * self.layers * self.heads * self.q_dim * seq


_LLAMA3 = "The Llama 3 Herd of Models (Meta, 2024), Table 3; vocabulary 128,256 from the released config.json"
_DEEPSEEK_V3 = (
    "DeepSeek-V3 Technical Report (DeepSeek-AI, 2024), section 4.2, and the released config.json "
    "(first 3 layers dense, FFN 18,432; vocabulary 129,280); 671B total, 37B activated per token"
)

_DEEPSEEK_R1 = (
    "DeepSeek-R1 (DeepSeek-AI, 2025): DeepSeek-V3-Base trained further; the released config.json "
    "gives V3's shape"
)

#: Named models: ``job: {model: llama3-70b}``.
MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape("llama3-8b", 32, 4096, 32, 8, 14336, 128256, source=_LLAMA3),
        ModelShape("llama3-70b", 80, 8192, 64, 8, 28672, 128256, source=_LLAMA3),
        ModelShape("llama3-405b", 126, 16384, 128, 8, 53248, 128256, source=_LLAMA3),
        ModelShape(
            "deepseek-v3-671b",
            layers=61,
            hidden=7168,
            heads=128,
            kv_heads=128,
            ffn=18432,
            vocab=129280,
            head_dim=192,  # 128 without position + 64 with RoPE, for the attention FLOPs
            experts=256,
            top_k=8,
            shared=1,
            expert_ffn=2048,
            dense_layers=3,
            latent=LatentAttention(q_rank=1536, kv_rank=512, nope_dim=128, rope_dim=64, v_dim=128),
            source=_DEEPSEEK_V3,
        ),
    )
}
MODELS["deepseek-r1-671b"] = replace(MODELS["deepseek-v3-671b"], name="deepseek-r1-671b", source=_DEEPSEEK_R1)
