"""What one rank's forward passes keep for the backward pass, as each engine's layers keep it: per layer,
per micro-batch, times the micro-batches in flight, plus the loss's. The formulas are written out in
``primus.plan.estimate``'s docstring; tests/plan/test_memory_measured.py holds them to 10% of what real
engine ranks keep.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus.plan.layout import DTYPE_BYTES, ParallelLayout
from primus.plan.model import ModelSpec


@dataclass(frozen=True)
class Shapes:
    """The sizes the activation terms multiply (one micro-batch on one rank)."""

    tokens: int  # s x b, s = seq_len / cp
    norm_tokens: int  # tokens a norm sees: / tp under sequence parallelism
    linear_tokens: int  # tokens a column-parallel linear saves as its input (TorchTitan gathers them)
    b: int
    s: int
    t: int
    e: int  # bytes of an activation


def _shapes(layout: ParallelLayout) -> Shapes:
    s = layout.seq_len // layout.cp
    b, t = layout.micro_batch_size, layout.tp
    tokens = s * b
    titan = layout.memory_model == "torchtitan"
    split = t > 1 and layout.sequence_parallel
    norm = tokens // t if split else tokens
    return Shapes(tokens, norm, tokens if titan else norm, b, s, t,
                  DTYPE_BYTES[layout.compute_dtype])


def _fused_norms(layout: ParallelLayout) -> bool:
    """GPU kernels: Transformer Engine's fused LayerNormLinear, torch's fused rms_norm on CUDA."""
    return layout.memory_model == "megatron-te" or (layout.memory_model == "torchtitan" and layout.gpu)


def norm_bytes(model: ModelSpec, layout: ParallelLayout, x: Shapes, width: int | None = None) -> int:
    """One norm and the linear that reads its output: composite (CPU) keeps its input in fp32 (the input
    itself, or an fp32 copy of a 16-bit one) and the fp32 normalised values; fused kernels keep the input
    and the reciprocal RMS. The output is kept by the linear after it."""
    width = width or model.dim
    kept = x.norm_tokens * width * (x.e if _fused_norms(layout) else 8) + 4 * x.norm_tokens
    return kept + x.linear_tokens * width * x.e


def _mla_bytes(model: ModelSpec, layout: ParallelLayout, x: Shapes) -> int:
    """Multi-latent attention (DeepSeek): the latent projection's output and its norm, then the core. On a
    CPU, TorchTitan's SDPA falls back to the math kernel (q/k and v head widths differ): q, k (transposed),
    v and the softmax probabilities are kept; fused kernels keep q, k, v and the output's log-sum-exp."""
    T, e, b, s = x.tokens, x.e, x.b, x.s
    a = model.n_heads // x.t
    qk, dv, rope = model.qk_nope_head_dim + model.qk_rope_head_dim, model.v_head_dim, model.qk_rope_head_dim
    latent = T * (model.kv_lora_rank + rope) * e + norm_bytes(model, layout, x, model.kv_lora_rank) \
        - x.linear_tokens * model.kv_lora_rank * e  # the latent norm's output is recomputed by wkv_b's input
    if model.q_lora_rank:
        latent += norm_bytes(model, layout, x, model.q_lora_rank)
    core = T * a * (2 * qk + dv) * e + T * a * dv * e  # q, k, v, the output
    scores = b * a * s * s * e if not (layout.gpu or layout.memory_model == "megatron-te") else 4 * b * a * s
    return latent + core + scores + 4 * b * s * rope


def attention_bytes(model: ModelSpec, layout: ParallelLayout, x: Shapes) -> int:
    if model.is_mla:
        return _mla_bytes(model, layout, x)
    T, t, e = x.tokens, x.t, x.e
    a, g, d = model.n_heads // t, max(1, model.kv_heads // t), model.head_dim
    return _qk_norm_bytes(model, layout, x, a + g, d) + _core_attention_bytes(model, layout, x, a, g, d)


def _qk_norm_bytes(model: ModelSpec, layout: ParallelLayout, x: Shapes, heads: int, d: int) -> int:
    """Per-head Q and K norms (Qwen3, Megatron's qk_layernorm): as the other norms, their outputs rotated."""
    if not model.qk_norm:
        return 0
    return x.tokens * heads * (d * (x.e if _fused_norms(layout) else 8) + 4)


def _core_attention_bytes(model: ModelSpec, layout: ParallelLayout, x: Shapes, a: int, g: int, d: int) -> int:
    T, e = x.tokens, x.e
    lse = 4 * x.b * a * x.s
    if layout.memory_model == "torchtitan":  # q, k rotated (and RoPE's table), v contiguous, SDPA's output, lse
        return T * (a + 2 * g) * d * e + T * a * d * e + lse + 4 * x.b * x.s * d
    if layout.memory_model == "megatron-te":  # fused QKV output, q and k rotated, flash attention
        return T * (a + 2 * g) * d * e + T * (a + g) * d * e + T * a * d * e + lse
    # megatron-core's local DotProductAttention: q rotated (and RoPE's cos and sin), k and v repeated to all
    # heads (k rotated itself when there is nothing to repeat), softmax probabilities, context
    q = T * a * d * e + 2 * x.s * d * e
    if layout.selective_recompute:  # the core attention is recomputed: it keeps q, k and v (a view of the
        return q + T * g * d * e + T * (a + 2 * g) * d * e + T * a * d * e  # fused QKV output) instead
    keys = 2 * T * a * d * e if a != g else T * a * d * e
    return q + keys + x.b * a * x.s * x.s * e + T * a * d * e


def mlp_bytes(model: ModelSpec, layout: ParallelLayout, x: Shapes, width: int, tokens: int | None = None) -> int:
    """A (gated) MLP of ``width`` on this rank: the matmul outputs and the activation's intermediates."""
    T, e, f = tokens if tokens is not None else x.tokens, x.e, width
    if layout.memory_model == "torchtitan":
        factor = 4 if model.swiglu else 2  # w1 and w3 outputs, silu, their product
    elif layout.memory_model == "megatron-te":
        factor = 3 if model.swiglu else 2  # fc1 output, the fused activation's output
    else:
        factor = 5 if model.swiglu else 2  # fc1 output, silu, the linear half (+ offset), their product
    return factor * T * f * e


def moe_bytes(model: ModelSpec, layout: ParallelLayout, x: Shapes) -> int:
    """Router scores (fp32), the tokens sent to this rank's experts (top_k copies of each, on average:
    routing at random initialisation is not balanced, so one rank's share varies), the experts' MLPs on
    them, and the shared experts. TorchTitan's grouped experts on a CPU compute in bf16: fp32 experts are
    cast (their weights and tokens) for each forward."""
    T, e, k, h = x.tokens, x.e, model.top_k, model.dim
    routed = T * k
    width = model.expert_ffn_dim // layout.expert_tp
    router = 3 * T * model.n_experts * 4
    dispatched = 2 * routed * h * e
    shared = mlp_bytes(model, layout, x, model.shared_expert_ffn_hidden_size // layout.tp) \
        if model.shared_expert_ffn_hidden_size else 0
    if layout.memory_model == "torchtitan" and not layout.gpu and e == 4:
        local = model.n_experts // layout.ep
        casts = 3 * local * width * h * 2 + routed * (h + width) * 2
        return router + routed * h * e + 4 * routed * width * 2 + casts + shared
    return router + dispatched + mlp_bytes(model, layout, x, width, routed) + shared


def layer_bytes(model: ModelSpec, layout: ParallelLayout, moe: bool) -> int:
    """One decoder layer, one micro-batch, no recomputation."""
    x = _shapes(layout)
    mlp = moe_bytes(model, layout, x) if moe else mlp_bytes(model, layout, x, model.ffn_dim // layout.tp)
    return 2 * norm_bytes(model, layout, x) + attention_bytes(model, layout, x) + mlp


def checkpoint_bytes(layout: ParallelLayout, model: ModelSpec) -> int:
    """What a checkpointed unit of layers keeps: its input, the residual stream."""
    x = _shapes(layout)
    return x.norm_tokens * model.dim * x.e


def loss_bytes(model: ModelSpec, layout: ParallelLayout) -> int:
    """The last stage's end: the final norm and what the loss keeps. Megatron: the logits in fp32
    (vocabulary-parallel cross-entropy); TorchTitan: its chunked loss keeps the norm's output, its chunks,
    an fp32 gradient accumulator and one chunk's logits (and fp32 log-softmax)."""
    x = _shapes(layout)
    vocab = -(-model.vocab_size // layout.tp)
    norm = norm_bytes(model, layout, x)
    if layout.memory_model == "torchtitan":
        chunk = x.tokens // max(1, layout.loss_chunks)
        return norm + x.tokens * model.dim * (x.e + 4) + chunk * vocab * (x.e + 4)
    return norm + 4 * x.tokens * vocab


def _selective_titan_layer(model: ModelSpec, layout: ParallelLayout, x: Shapes, moe: bool) -> int:
    """TorchTitan's op-level selective checkpointing keeps each block's input and the outputs of the ops it
    saves: every other matmul (the fused QKV, w1, w2) and, on a GPU, the attention kernel's output and
    log-sum-exp (its save list names the CUDA kernels; the CPU's flash attention is recomputed)."""
    T, e, t = x.tokens, x.e, x.t
    a, g, d = model.n_heads // t, max(1, model.kv_heads // t), model.head_dim
    width = (model.expert_ffn_dim // layout.expert_tp if moe else model.ffn_dim // t)
    tokens = T * model.top_k if moe else T
    attention = T * a * d * e + 4 * x.b * a * x.s if layout.gpu else 0
    return (x.norm_tokens * model.dim * e + T * (a + 2 * g) * d * e + attention
            + tokens * width * e + T * model.dim * e)


def chunk_bytes(model: ModelSpec, layout: ParallelLayout, layers: tuple[int, ...]) -> int:
    """A model chunk's layers, one micro-batch, with the layout's recomputation."""
    pattern = model.moe_layer_pattern()
    x = _shapes(layout)
    if layout.selective_recompute and layout.memory_model == "torchtitan":
        return sum(_selective_titan_layer(model, layout, x, bool(pattern[i])) for i in layers)
    if not layout.recompute:
        return sum(layer_bytes(model, layout, bool(pattern[i])) for i in layers)
    count = len(layers) if layout.recompute_layers is None else min(len(layers), layout.recompute_layers)
    group = layout.recompute_group
    kept = -(-count // group) * checkpoint_bytes(layout, model)
    return kept + sum(layer_bytes(model, layout, bool(pattern[i])) for i in layers[count:])


def inputs_bytes(model: ModelSpec, layout: ParallelLayout) -> int:
    """The micro-batch itself: tokens, labels, positions, loss mask; megatron-core's datasets also build a
    causal mask (one byte per query-key pair) per sample, and its RoPE table (fp32) is built per forward."""
    x = _shapes(layout)
    if layout.memory_model not in ("megatron", "megatron-te"):
        return 28 * x.b * x.s
    return 28 * x.b * x.s + (x.b + 1) * x.s * x.s + 4 * x.s * model.head_dim


def resident_bytes(model: ModelSpec, layout: ParallelLayout) -> int:
    """Allocated by a first forward pass and kept by the engine for the next: megatron-core's local attention
    computes its scores into one global buffer (b x heads x s x s)."""
    if layout.memory_model != "megatron" or model.is_mla:
        return 0
    x = _shapes(layout)
    return x.b * (model.n_heads // x.t) * x.s * x.s * x.e


def forwards_in_flight(layout: ParallelLayout, pp_rank: int, microbatches: int) -> list[int]:
    """The model chunks of the forward passes whose backward has not begun when this rank's first backward
    begins (1F1B: pp - rank micro-batches; interleaved 1F1B: Megatron's warm-up, groups of pp micro-batches
    per chunk)."""
    pp, vpp = layout.pp, layout.vpp
    if vpp == 1:
        return [0] * min(pp - pp_rank, microbatches)
    count = min(microbatches * vpp, (pp - pp_rank - 1) * 2 + (vpp - 1) * pp + 1)
    return [(k // pp) % vpp for k in range(count)]


@dataclass(frozen=True)
class RankActivations:
    activations: int  # the decoder layers (and embedding) of every micro-batch in flight
    loss: int  # the last stage's final norm and loss (one micro-batch)
    per_layer: int  # one layer, one micro-batch, as recomputed
    layers: int  # decoder layers on this rank
    in_flight: int  # micro-batch forward passes in flight (model chunks, interleaved)


def rank_activations(model: ModelSpec, layout: ParallelLayout, pp_rank: int = 0) -> RankActivations:
    placement = layout.chunk_placement(model.n_layers)[pp_rank]
    flights = forwards_in_flight(layout, pp_rank, layout.num_microbatches)
    per_chunk = [chunk_bytes(model, layout, chunk.layers) + (inputs_bytes(model, layout) if chunk.embedding else 0)
                 for chunk in placement]
    loss = sum(1 for c in flights if placement[c].loss) * loss_bytes(model, layout)
    layers = sum(len(chunk.layers) for chunk in placement)
    one = chunk_bytes(model, layout, (placement[0].layers or (0,))[:1]) if model.n_layers else 0
    resident = resident_bytes(model, layout) if layers else 0
    if layout.memory_model == "torchtitan" and layout.pp > 1:
        resident += pipeline_buffers(model, layout, sum(1 for c in flights if not placement[c].loss))
    return RankActivations(sum(per_chunk[c] for c in flights) + resident, loss, one, layers, len(flights))


def pipeline_buffers(model: ModelSpec, layout: ParallelLayout, outputs_in_flight: int) -> int:
    """torch.distributed.pipelining (TorchTitan): a receive buffer for every micro-batch of the step, and
    each forward's output kept until its backward (megatron-core frees an output once sent)."""
    x = _shapes(layout)
    stage = x.norm_tokens * model.dim * x.e
    return (layout.num_microbatches + outputs_in_flight) * stage
