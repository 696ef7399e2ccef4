"""The neutral description of a decoder-only LLM (dense or MoE, GQA or MLA), shared by every LLM backend.

Each backend describes its network in these terms (``EnginePlan.model``), so parameters, FLOPs and
memory are computed one way for all engines (``primus.plan``). A neutral model preset
(``configs/models/common/*.yaml``) holds one ``model:`` block of these keys; TorchTitan and Megatron
each translate it into their own model config, so switching ``framework:`` keeps the same network.
The Megatron presets (``configs/models/megatron/*.yaml``, flat Megatron-LM keys) are read into a
``ModelSpec`` by ``primus.backends.megatron.plan``.

Parameter counts (``ModelSpec.param_counts``) are exact for the network megatron-core builds
(and TorchTitan's decoder for the dense keys): every weight, bias and norm. Megatron-LM's own
count (``megatron/training/theoretical_memory_usage.py``) agrees term by term and leaves out the
routers, QKV biases, per-head Q/K norms and the MTP input projection and its norms;
``ParamCounts.megatron_counted`` is that subset (a test checks it against Megatron-LM's function).

Initialisation is the engines' own, and their defaults differ where it matters most in the first
steps: TorchTitan draws the token embedding with std 1.0, Megatron with ``init_method_std`` (0.02),
which on the 25M benchmark preset alone moves the 10-step loss from 1.6 to 4.1.
``embedding_init_std`` sets it on both (Megatron's ``embedding_init_method_std``). What remains
differs by engine and has no Megatron knob: the LM head (TorchTitan dim**-0.5, Megatron 0.02) and
the depth scaling of the output projections (TorchTitan per layer, Megatron by the layer count).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ModelSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    family: str = Field("llama3", description="informational: llama2, llama3, llama3.1 ...")
    n_layers: int = Field(gt=0)
    dim: int = Field(gt=0, description="hidden size")
    n_heads: int = Field(gt=0)
    n_kv_heads: int | None = Field(None, gt=0, description="GQA groups; None = MHA")
    ffn_hidden_size: int | None = Field(None, gt=0, description="explicit SwiGLU width")
    ffn_dim_multiplier: float | None = None
    multiple_of: int = 256
    vocab_size: int = Field(gt=0)
    rope_theta: float = 500000.0
    rope_scaling: Literal["llama"] | None = Field(None, description="Llama 3.1 long-context RoPE scaling")
    norm_eps: float = 1e-5
    max_seq_len: int = 131072
    tie_embeddings: bool = False
    learned_position_embeddings: bool = Field(
        False, description="a learned max_seq_len x dim position table (Megatron-LM's learned_absolute: GPT-2/3)")
    # Attention details beyond Llama (Qwen, DeepSeek).
    head_dim: int = Field(None, gt=0, description="per-head width; default dim / n_heads (Qwen3 sets its own)")
    qkv_bias: bool = Field(False, description="biases on the Q/K/V projections (Qwen2)")
    qk_norm: bool = Field(False, description="RMSNorm on queries and keys per head (Qwen3); MLA: on the latents")
    linear_bias: bool = Field(False, description="biases on every linear layer (Megatron-LM's add_bias_linear, GPT-style)")
    swiglu: bool = Field(True, description="gated MLP (3 matrices); False = 2-matrix MLP (GPT). TorchTitan builds SwiGLU only")
    normalization: Literal["rmsnorm", "layernorm"] = Field(
        "rmsnorm", description="LayerNorm has a bias too (2 x dim per norm). TorchTitan builds RMSNorm only")
    # Multi-latent attention (DeepSeek V2/V3); on when kv_lora_rank is set.
    q_lora_rank: int | None = Field(None, gt=0, description="MLA query compression rank; None = no Q LoRA")
    kv_lora_rank: int | None = Field(None, gt=0, description="MLA key/value compression rank")
    qk_nope_head_dim: int | None = Field(None, gt=0, description="MLA per-head Q/K width without RoPE")
    qk_rope_head_dim: int | None = Field(None, gt=0, description="MLA per-head Q/K width with RoPE")
    v_head_dim: int | None = Field(None, gt=0, description="MLA per-head value width")
    # Mixture of experts; dense when n_experts is 0.
    n_experts: int = Field(0, ge=0, description="routed experts per MoE layer")
    top_k: int = Field(0, ge=0, description="experts each token is routed to")
    moe_ffn_hidden_size: int | None = Field(None, gt=0, description="width of one routed expert")
    shared_expert_ffn_hidden_size: int = Field(0, ge=0, description="total width of the shared experts")
    moe_layer_freq: int | list[int] = Field(
        1, description="Megatron-LM's --moe-layer-freq: every k-th layer is MoE, or a 0/1 per layer")
    mtp_layers: int = Field(0, ge=0, description="multi-token-prediction layers (DeepSeek V3)")
    embedding_init_std: float | None = Field(
        None, gt=0,
        description="std of the normal init of the token embedding; None = each engine's own default "
                    "(TorchTitan 1.0, Megatron init_method_std = 0.02). Set it for the same start on every backend.")

    @model_validator(mode="before")
    @classmethod
    def _default_head_dim(cls, data):
        if isinstance(data, dict) and data.get("head_dim") is None:
            dim, heads = data.get("dim"), data.get("n_heads")
            if isinstance(dim, int) and isinstance(heads, int) and heads > 0:
                if dim % heads:
                    raise ValueError(f"dim ({dim}) must be divisible by n_heads ({heads}) unless head_dim is set")
                data = {**data, "head_dim": dim // heads}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "ModelSpec":
        if self.n_kv_heads and self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads})")
        if self.kv_lora_rank is not None:
            missing = [k for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim") if getattr(self, k) is None]
            if missing:
                raise ValueError(f"multi-latent attention (kv_lora_rank set) needs {', '.join(missing)}")
        if self.n_experts:
            if not 1 <= self.top_k <= self.n_experts:
                raise ValueError(f"top_k ({self.top_k}) must be between 1 and n_experts ({self.n_experts})")
            freq = self.moe_layer_freq
            if isinstance(freq, int) and freq < 1:
                raise ValueError(f"moe_layer_freq ({freq}) must be a positive integer or a 0/1 list")
            if isinstance(freq, list) and (len(freq) != self.n_layers or set(freq) - {0, 1}):
                raise ValueError(f"moe_layer_freq as a list needs one 0/1 per layer ({self.n_layers}), got {freq}")
        elif self.top_k:
            raise ValueError(f"top_k ({self.top_k}) set on a dense model (n_experts is 0)")
        return self

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def ffn_dim(self) -> int:
        """SwiGLU width: explicit, or Llama's 2/3 * 4 * dim rounding rule."""
        if self.ffn_hidden_size:
            return self.ffn_hidden_size
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    @property
    def expert_ffn_dim(self) -> int:
        """Width of one routed expert (Megatron-LM: ffn_hidden_size when moe_ffn_hidden_size is unset)."""
        return self.moe_ffn_hidden_size or self.ffn_dim

    def moe_layer_pattern(self) -> list[int]:
        """1 where layer i (from 0) has an MoE MLP: Megatron-LM's ``--moe-layer-freq`` (every k-th layer
        counting from layer 0, or an explicit 0/1 list)."""
        if not self.is_moe:
            return [0] * self.n_layers
        if isinstance(self.moe_layer_freq, list):
            return list(self.moe_layer_freq)
        return [1 if i % self.moe_layer_freq == 0 else 0 for i in range(self.n_layers)]

    @property
    def mtp_layer_is_moe(self) -> bool:
        """An MTP layer repeats the last decoder layer's kind (Megatron-LM)."""
        return bool(self.moe_layer_pattern()[-1])

    # One layer's pieces, for the counts here and the per-rank split in ``primus.plan.estimate``.
    def norm_params(self, width: int) -> int:
        return width * (2 if self.normalization == "layernorm" else 1)

    def attention_split_params(self) -> int:
        """Attention weights split by tensor parallelism (one layer)."""
        h, n = self.dim, self.n_heads
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q_up = h * n * qk if self.q_lora_rank is None else self.q_lora_rank * n * qk
            kv_up = self.kv_lora_rank * n * (self.qk_nope_head_dim + self.v_head_dim)
            return q_up + kv_up + n * self.v_head_dim * h
        q, kv = n * self.head_dim, self.kv_heads * self.head_dim
        return h * (q + 2 * kv) + q * h

    def attention_replicated_params(self) -> int:
        """Attention weights every TP rank holds whole (one layer): MLA's down-projections (megatron-core
        builds them duplicated) and latent norms."""
        if not self.is_mla:
            return 0
        h = self.dim
        down = h * (self.q_lora_rank or 0) + h * (self.kv_lora_rank + self.qk_rope_head_dim)
        norms = self.norm_params((self.q_lora_rank or 0) + self.kv_lora_rank) if self.qk_norm else 0
        return down + norms

    def qkv_bias_params(self) -> int:
        if self.is_mla or not (self.qkv_bias or self.linear_bias):
            return 0
        return (self.n_heads + 2 * self.kv_heads) * self.head_dim

    def mlp_bias_params(self, width: int) -> int:
        """Biases of one MLP of ``width`` (fc1 and fc2) when ``linear_bias``."""
        return ((2 if self.swiglu else 1) * width + self.dim) if self.linear_bias and width else 0

    def qk_norm_params(self) -> int:
        """Per-head Q and K norms (Qwen3); MLA's latent norms are part of its attention."""
        return 2 * self.norm_params(self.head_dim) if self.qk_norm and not self.is_mla else 0

    def mlp_params(self, width: int) -> int:
        return (3 if self.swiglu else 2) * self.dim * width + self.mlp_bias_params(width)

    def attention_bias_params(self) -> int:
        """The output projection's bias when ``linear_bias`` (megatron-core's MLA has none but this one)."""
        return self.dim if self.linear_bias else 0

    def _linear_bias_params(self, dense_layers: int, moe_layers: int, layers: int) -> int:
        return (layers * self.attention_bias_params() + dense_layers * self.mlp_bias_params(self.ffn_dim)
                + moe_layers * (self.n_experts * self.mlp_bias_params(self.expert_ffn_dim)
                                + self.mlp_bias_params(self.shared_expert_ffn_hidden_size)))

    def position_embedding_params(self) -> int:
        """The learned position table (megatron-core: a plain ``nn.Embedding``, whole on every TP rank)."""
        return self.max_seq_len * self.dim if self.learned_position_embeddings else 0

    def mtp_projection_params(self) -> int:
        """One MTP layer beyond its transformer layer: the 2h -> h projection, enorm, hnorm, final norm."""
        return 2 * self.dim * self.dim + 3 * self.norm_params(self.dim)

    def param_counts(self, mtp: bool = True) -> "ParamCounts":
        """Parameters by component; ``mtp=False`` leaves the multi-token-prediction layers out."""
        pattern = self.moe_layer_pattern()
        extra = self.mtp_layers if mtp else 0
        moe_layers = sum(pattern) + (extra if self.mtp_layer_is_moe else 0)
        dense_layers = self.n_layers + extra - moe_layers
        layers = self.n_layers + extra
        attention = self.attention_split_params() + self.attention_replicated_params() + self.attention_bias_params()
        embedding = self.vocab_size * self.dim
        return ParamCounts(
            embedding=embedding,
            position_embedding=self.position_embedding_params(),
            output_head=0 if self.tie_embeddings else embedding,
            attention=layers * attention,
            qkv_bias=layers * self.qkv_bias_params(),
            linear_biases=self._linear_bias_params(dense_layers, moe_layers, layers),
            qk_norms=layers * self.qk_norm_params(),
            dense_mlp=dense_layers * self.mlp_params(self.ffn_dim),
            routed_experts=moe_layers * self.n_experts * self.mlp_params(self.expert_ffn_dim),
            active_routed_experts=moe_layers * self.top_k * self.mlp_params(self.expert_ffn_dim),
            shared_experts=moe_layers * self.mlp_params(self.shared_expert_ffn_hidden_size),
            routers=moe_layers * self.n_experts * self.dim,
            norms=(2 * layers + 1) * self.norm_params(self.dim),
            mtp_projection=extra * self.mtp_projection_params(),
        )

    def matmul_params(self, mtp: bool = True) -> int:
        """Weights in the matrix multiplies one token goes through: attention projections, the MLP (for MoE
        the ``top_k`` routed and the shared experts; routers aside), the MTP projections and the output
        head (counted even when tied: the logits are a matmul)."""
        c = self.param_counts(mtp)
        mla_norms = 0
        if self.is_mla and self.qk_norm:
            mla_norms = (self.n_layers + (self.mtp_layers if mtp else 0)) * self.norm_params(
                (self.q_lora_rank or 0) + self.kv_lora_rank)
        projection = (self.mtp_layers if mtp else 0) * 2 * self.dim * self.dim
        return (c.attention - mla_norms + c.dense_mlp + c.active_routed_experts + c.shared_experts + projection
                + self.vocab_size * self.dim)

    def total_params(self, mtp: bool = True) -> int:
        """Every parameter (exact; see ``param_counts``)."""
        return self.param_counts(mtp).total

    def active_params(self, mtp: bool = True) -> int:
        """Parameters one token touches: all but the routed experts it is not sent to (equals
        ``total_params`` for a dense model). Embedding and output head included, as Qwen, Mistral and
        DeepSeek-V3 count "activated" parameters; OpenAI's gpt-oss card leaves the input embedding out."""
        return self.param_counts(mtp).active


@dataclass(frozen=True)
class ParamCounts:
    """A model's parameters by component (every layer, including MTP layers when counted)."""

    embedding: int  # token embedding table
    position_embedding: int  # learned position table (0 with RoPE)
    output_head: int  # 0 when tied to the embedding
    attention: int  # projections (MLA: down/up projections and latent norms)
    qkv_bias: int
    linear_biases: int  # of attention and the MLPs/experts above: their biases when linear_bias (GPT-style)
    qk_norms: int  # per-head Q/K norms
    dense_mlp: int  # the MLPs of the dense layers
    routed_experts: int  # all routed experts of all MoE layers
    active_routed_experts: int  # the top_k a token goes through, per MoE layer
    shared_experts: int
    routers: int
    norms: int  # two per layer and the final norm
    mtp_projection: int  # MTP's 2h -> h projection and its three norms, per MTP layer

    @property
    def total(self) -> int:
        return (self.embedding + self.position_embedding + self.output_head + self.attention + self.qkv_bias
                + self.qk_norms + self.dense_mlp + self.routed_experts + self.shared_experts + self.routers + self.norms
                + self.mtp_projection)

    @property
    def active(self) -> int:
        return self.total - self.routed_experts + self.active_routed_experts

    @property
    def megatron_counted(self) -> int:
        """What Megatron-LM's ``compute_weight_and_optimizer_memory`` counts: no routers, biases,
        per-head Q/K norms, learned position table, or MTP projections and their norms."""
        return (self.total - self.routers - self.qkv_bias - self.linear_biases - self.qk_norms
                - self.mtp_projection - self.position_embedding)
