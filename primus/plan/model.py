"""The neutral description of a decoder-only LLM (dense or MoE, GQA or MLA), shared by every LLM backend.

Each backend describes its network in these terms (``EnginePlan.model``), so parameters, FLOPs and
memory are computed one way for all engines (``primus.plan``). A model preset (``configs/models/common/*.yaml``) holds one ``model:`` block of these keys;
TorchTitan and Megatron each translate it into their own model config, so switching
``framework:`` keeps the same network.

Initialisation is the engines' own, and their defaults differ where it matters most in the first
steps: TorchTitan draws the token embedding with std 1.0, Megatron with ``init_method_std`` (0.02),
which on the 25M benchmark preset alone moves the 10-step loss from 1.6 to 4.1.
``embedding_init_std`` sets it on both (Megatron's ``embedding_init_method_std``). What remains
differs by engine and has no Megatron knob: the LM head (TorchTitan dim**-0.5, Megatron 0.02) and
the depth scaling of the output projections (TorchTitan per layer, Megatron by the layer count).
"""
from __future__ import annotations

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
    # Attention details beyond Llama (Qwen, DeepSeek).
    head_dim: int = Field(None, gt=0, description="per-head width; default dim / n_heads (Qwen3 sets its own)")
    qkv_bias: bool = Field(False, description="biases on the Q/K/V projections (Qwen2)")
    qk_norm: bool = Field(False, description="RMSNorm on queries and keys per head (Qwen3)")
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
    def _heads_divide(self) -> "ModelSpec":
        if self.n_kv_heads and self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads})")
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

    def matmul_params(self) -> int:
        """Parameters in matrix multiplies: attention + MLP of every layer, plus the output head."""
        attention = self.dim * self.head_dim * (self.n_heads + 2 * self.kv_heads) + self.n_heads * self.head_dim * self.dim
        mlp = 3 * self.dim * self.ffn_dim
        return self.n_layers * (attention + mlp) + self.dim * self.vocab_size

    def total_params(self) -> int:
        """Exact count: matmuls + embedding (unless tied) + two norms per layer + final norm."""
        embedding = 0 if self.tie_embeddings else self.vocab_size * self.dim
        norms = (2 * self.n_layers + 1) * self.dim
        return self.matmul_params() + embedding + norms
