"""Parameters, FLOPs and per-rank memory of a decoder (dense or MoE, GQA or MLA) under a ``ParallelLayout``.

Pure functions: no process group, no accelerator. ``primus plan`` prints them; the
preflight ``experiment`` check compares them with the memory each rank really has.

Parameters per rank (the heaviest pipeline stage), as megatron-core places them
    Attention, dense MLPs, shared experts, embedding and output head are split by TP; norms,
    routers and MLA's down-projections are whole on every TP rank. Routed experts are split
    over EP ranks (``n_experts / ep`` each) and each expert's matrices over ETP. A stage holds
    ``n_layers / pp`` consecutive layers, or those Megatron's ``pipeline_model_parallel_layout``
    places on it (MoE where ``moe_layer_freq`` says); the first stage
    also holds the embedding, the last the final norm, the output head (a tied head is a second
    copy when pp > 1, as in Megatron) and the MTP layers. With tp = pp = ep = 1 this is exactly
    ``ModelSpec.total_params()``.

Memory per rank, bytes: as the engine that runs the layout lays it out (``ParallelLayout.memory_model``:
megatron = megatron-core 0.16's local layer spec, the CPU's; megatron-te = its Transformer Engine spec, a
GPU's; torchtitan = TorchTitan 0.3.0). ``primus.plan.memory`` computes them; tests/plan/test_memory_measured.py
holds weights, grads and optimizer to the bytes counted on real ranks after one step, activations to 10%
(the residuals: docs/plan.md). The heaviest rank is reported (every pipeline stage, the most-owning shard).
N = the rank's parameters, split as the engine splits them (``primus.plan.tensors``); B(x) = bytes of dtype x.

  megatron, megatron-te (DistributedDataParallel and the Megatron optimizer)
    Per model chunk, one contiguous buffer for dense parameters and one for routed experts, parameters in
    reverse registration order. With the distributed optimizer each parameter starts at a multiple of 64
    elements, a tied embedding copy (pp > 1) gets a bucket of its own, a bucket closes once it holds
    ``grad_bucket_size`` parameters (overlap_grad_reduce; chunk 0 of the first pipeline rank only), and
    each bucket ends at a multiple of lcm(D, 128), D = dp x cp (experts: tp x dp x cp / (ep x etp)).
      weights   = buffer elements x B(param) with the distributed optimizer, else N x B(param)
      grads     = buffer elements x B(grad)         (grad fp32 under bf16: accumulate_allreduce_grads_in_fp32)
      optimizer = owned x (4 [an fp32 main copy of 16-bit weights] + 2 x 4 [Adam's moments]), owned = N, or
                  with the distributed optimizer the parameter elements (not padding) of this rank's
                  1/D of each bucket
    e.g. mixed-precision Adam unsharded: 2 + 4 + 12 = 18 bytes per parameter (Megatron-LM's
    theoretical_memory_usage.py: 18, or 6 + 12 / dp with the distributed optimizer), plus padding.
  torchtitan (FSDP2 on every parameter, a shard group of one included; parameters stay fp32,
    mixed_precision_param is what the forward computes in)
    S = dp_shard x cp (routed experts: dp_shard x cp x tp / ep, sharded on their second dimension when
    there are fewer experts than S); rows = a tensor's first dimension after the tensor/expert split
      weights   = sum ceil(rows / S) x rest x 4     (each shard padded)
      grads     = sum ceil(rows / S) x rest x B(mixed_precision_reduce), plus the output head's again on
                  the last stage under pipeline parallelism (its chunked loss reduces the head alone first)
      optimizer = sum owned_rows x rest x 2 x 4     (rank 0 owns ceil(rows / S) of each)
  generic (no engine; Megatron with FSDP, not yet measured): N x bytes, divided by D where sharded (ZeRO-1
    the optimizer, FSDP all three).

  activations: what the forward passes keep for the backward pass, per layer per micro-batch; T = tokens
  (seq_len / cp x micro_batch_size), T_n = T / tp under sequence parallelism, h = dim, a, g = heads and
  KV heads on this rank, d = head width, f = MLP width on this rank, s, b = sequence, micro-batch,
  e = B(compute dtype)
    norm (2 per layer, + the final one)   CPU (torch's composite): its input in fp32 (itself, or a copy of a
        16-bit one) and the normalised fp32 values, 8 T_n h + 4 T_n; GPU (fused kernels): e T_n h + 4 T_n;
        and its output, kept by the next linear: e T_n h (TorchTitan with TP: gathered, e T h)
    attention  megatron local: e T a d (q) + 2 e s d (RoPE cos, sin) + 2 e T a d (k, v repeated to a heads;
                 e T a d without GQA) + e b a s^2 (softmax) + e T a d (context), and one e b a s^2 scores
                 buffer per rank; selective recompute keeps e T (a + 2g) d + e T (a + g) d + e T a d instead
               megatron-te: e T (a + 2g) d (QKV output) + e T (a + g) d (q, k rotated) + e T a d + 4 b a s
               torchtitan: e T (a + 2g) d (q, k rotated, v) + e T a d + 4 b a s (output, log-sum-exp) + 4 b s d
               MLA: the latent projection, its norm, e T a (2 qk + 2 dv) (q, k, v, output); the CPU's SDPA
                 math kernel also e b a s^2, fused kernels 4 b a s
    MLP        megatron local 5 e T f, megatron-te 3 e T f, torchtitan 4 e T f (gated; 2 e T f otherwise)
    MoE        router 12 T E, dispatched tokens, the experts' MLP on top_k x T tokens (the balanced share:
               at initialisation routing is not balanced, so one rank's share varies), shared experts
    recompute  full: a checkpointed unit of layers keeps its input, e T_n h (megatron uniform: units of
               recompute_num_layers; block: the first recompute_num_layers layers of each chunk); TorchTitan
               selective (op-level): the block's input, the fused QKV, w1 and w2 outputs (on a GPU also
               attention's output and log-sum-exp: its save list names the CUDA kernels)
    in flight  1F1B: min(pp - rank, micro-batches) micro-batches; interleaved (vpp chunks):
               min(m x vpp, 2 (pp - rank - 1) + (vpp - 1) pp + 1) chunk forwards; TorchTitan's pipelining also
               keeps a receive buffer per micro-batch and each forward's output, e T_n h each
    loss       megatron: the fp32 logits, 4 T V / tp; TorchTitan's chunked loss: the norm's output and its
               chunks, an fp32 gradient accumulator, (e + 4) T h, and one chunk's logits and fp32 log-softmax,
               (e + 4) T V / (tp x loss_chunks)
    generic: Korthikanti et al. 2022, per layer s b h (34 + 5 a s / h) / tp (16-bit, sequence parallel;
    the 5 a s / h softmax term dropped with ``flash_attention``), full recompute 2 s b h / tp, logits
    4 s b V / tp, times min(pp, micro-batches).

  Not counted: the CUDA/HIP context and allocator fragmentation (hence the ``memory.usable_fraction``
  threshold), FSDP's gathered (unsharded) parameters during forward and backward, short-lived
  temporaries, communication buffers, dropout masks (the Llama-family presets train without).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from primus.config.errors import ConfigError, did_you_mean
from primus.plan.model import ModelSpec
from primus.plan.layout import DTYPE_BYTES, ParallelLayout
from primus.plan.devices import DEVICE_MEMORY_GIB, PEAK_TFLOPS, device_key
from primus.plan.flops import flops_per_token

GIB = 1024**3

def device_memory_bytes(device: str) -> int:
    """Memory of a named device (``mi355x``, ``h100``, or a full name such as ``NVIDIA H100 80GB HBM3``)."""
    key = device.lower() if device.lower() in DEVICE_MEMORY_GIB else device_key(device)
    if key not in DEVICE_MEMORY_GIB:
        raise ConfigError(f"unknown device '{device}'{did_you_mean(device.lower(), DEVICE_MEMORY_GIB)}; "
                          f"known: {', '.join(sorted(DEVICE_MEMORY_GIB))}")
    return int(DEVICE_MEMORY_GIB[key] * GIB)


def _split(count: int, parts: int) -> int:
    return -(-count // parts)


@dataclass
class ParamEstimate:
    total: int  # every parameter, MTP layers included
    matmul: int  # weights a token multiplies by (MoE: top_k routed experts); see ModelSpec.matmul_params
    per_rank: int  # heaviest pipeline stage, after the TP/EP split, before any DP sharding
    per_stage: list[int]
    active: int = 0  # parameters one token touches (== total for a dense model)
    mtp: int = 0  # of total, in the multi-token-prediction layers
    per_rank_experts: int = 0  # of per_rank, routed-expert weights (sharded over the expert-data-parallel group)
    active_without_mtp: int = 0  # as published for DeepSeek-V3 (37B): the MTP layers left out


def _layer_on_rank(model: ModelSpec, layout: ParallelLayout, moe: bool) -> tuple[int, int]:
    """(non-expert, routed-expert) parameters of one layer on one rank."""
    t = layout.tp
    base = (_split(model.attention_split_params(), t) + model.attention_replicated_params()
            + _split(model.qkv_bias_params(), t) + model.qk_norm_params() + 2 * model.norm_params(model.dim))
    if not moe:
        return base + _split(model.mlp_params(model.ffn_dim), t), 0
    base += model.n_experts * model.dim + _split(model.mlp_params(model.shared_expert_ffn_hidden_size), t)
    experts = (model.n_experts // layout.ep) * _split(model.mlp_params(model.expert_ffn_dim), layout.expert_tp)
    return base, experts


def estimate_params(model: ModelSpec, layout: ParallelLayout) -> ParamEstimate:
    """Parameters per pipeline stage on one rank: layers in order (MoE where the pattern says), the
    embedding on the first stage, final norm + output head + MTP layers on the last (as Megatron)."""
    t, p = layout.tp, layout.pp
    pattern = model.moe_layer_pattern()
    embedding = _split(model.vocab_size * model.dim, t)
    layer_ids = layout.stage_layer_ids(model.n_layers)
    stages, experts = [], []
    for stage in range(p):
        layers = [_layer_on_rank(model, layout, bool(pattern[i])) for i in layer_ids[stage] if i < len(pattern)]
        params, expert = sum(a for a, _ in layers), sum(b for _, b in layers)
        if stage == 0:
            params += embedding + model.position_embedding_params()
        if stage == p - 1:
            params += model.norm_params(model.dim) + (0 if model.tie_embeddings and p == 1 else embedding)
            mtp_base, mtp_experts = _layer_on_rank(model, layout, model.mtp_layer_is_moe)
            params += model.mtp_layers * (mtp_base + _split(2 * model.dim * model.dim, t)
                                          + 3 * model.norm_params(model.dim))
            expert += model.mtp_layers * mtp_experts
        stages.append(params + expert)
        experts.append(expert)
    heaviest = max(range(p), key=lambda i: stages[i])
    counts = model.param_counts()
    return ParamEstimate(counts.total, model.matmul_params(), stages[heaviest], stages, counts.active,
                         counts.total - model.total_params(mtp=False), experts[heaviest], model.active_params(mtp=False))


@dataclass
class MemoryEstimate:
    weights: int
    grads: int
    optimizer: int
    activations: int
    activations_per_layer: int
    layers_per_stage: int
    microbatches_in_flight: int
    logits: int
    flash_attention: bool
    pp_rank: int = 0  # the rank's pipeline stage
    rank: int = 0  # a global rank with these bytes (the first of its stage and shard index)

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.optimizer + self.activations + self.logits

    def components(self) -> dict[str, int]:
        return {"weights": self.weights, "grads": self.grads, "optimizer": self.optimizer,
                "activations": self.activations, "logits": self.logits, "total": self.total}


def activation_bytes_per_layer(model: ModelSpec, layout: ParallelLayout, flash_attention: bool = True) -> int:
    """Korthikanti et al.: see the module docstring."""
    s = layout.seq_len // layout.cp
    b, h, a, t = layout.micro_batch_size, model.dim, model.n_heads, layout.tp
    if layout.recompute:
        return 2 * s * b * h // t
    scores = 0 if flash_attention else 5 * a * s * s * b
    return (34 * s * b * h + scores) // t


def estimate_memory(model: ModelSpec, layout: ParallelLayout, *, flash_attention: bool = True) -> MemoryEstimate:
    """The heaviest rank's bytes: the engine's own layout of them (``layout.memory_model``), else the
    textbook formulas."""
    if layout.memory_model == "generic":
        return _textbook_memory(model, layout, flash_attention)
    ranks = [rank_memory(model, layout, pp_rank, None, None) for pp_rank in range(layout.pp)]
    return max(ranks, key=lambda memory: memory.total)


def rank_memory(model: ModelSpec, layout: ParallelLayout, pp_rank: int = 0, shard_rank: int | None = 0,
                expert_rank: int | None = 0) -> MemoryEstimate:
    """One rank, by its pipeline rank and its index in the sharding groups (None: the heaviest index)."""
    from primus.plan.activations import rank_activations
    from primus.plan.memory import rank_state

    state = rank_state(model, layout, pp_rank, shard_rank, expert_rank)
    acts = rank_activations(model, layout, pp_rank)
    flash = layout.memory_model != "megatron"  # megatron-core's local attention keeps the softmax
    return MemoryEstimate(state.weights, state.grads, state.optimizer, acts.activations, acts.per_layer, acts.layers,
                          acts.in_flight, acts.loss, flash, pp_rank=pp_rank,
                          rank=pp_rank * (layout.world_size // layout.pp) + (shard_rank or 0) * layout.tp)


def _textbook_memory(model: ModelSpec, layout: ParallelLayout, flash_attention: bool) -> MemoryEstimate:
    params = estimate_params(model, layout)
    dense, experts = params.per_rank - params.per_rank_experts, params.per_rank_experts
    shards, expert_shards = layout.dp * layout.cp, layout.expert_dp

    def sharded(bytes_per_param: int) -> int:
        return _split(dense * bytes_per_param, shards) + _split(experts * bytes_per_param, expert_shards)

    fsdp = layout.sharding == "fsdp"
    master = 4 if layout.master_weights and layout.param_dtype != "fp32" else 0
    weight_bytes, grad_bytes = DTYPE_BYTES[layout.param_dtype], DTYPE_BYTES[layout.grad_dtype]
    optimizer_bytes = master + 2 * DTYPE_BYTES[layout.optimizer_dtype]
    n = params.per_rank
    weights = sharded(weight_bytes) if fsdp else n * weight_bytes
    grads = sharded(grad_bytes) if fsdp else n * grad_bytes
    optimizer = sharded(optimizer_bytes) if layout.sharding in ("optimizer", "fsdp") else n * optimizer_bytes
    per_layer = activation_bytes_per_layer(model, layout, flash_attention)
    layers = max(len(ids) for ids in layout.stage_layer_ids(model.n_layers))
    in_flight = min(layout.pp, layout.num_microbatches)
    s = layout.seq_len // layout.cp
    logits = 4 * s * layout.micro_batch_size * model.vocab_size // layout.tp
    return MemoryEstimate(weights, grads, optimizer, per_layer * layers * in_flight, per_layer, layers,
                          in_flight, logits, flash_attention)


def fits_nowhere(memory: MemoryEstimate, usable_fraction: float) -> str | None:
    """Why no known device can hold the heaviest rank even without activations (the layout is impossible
    wherever it runs), or None."""
    static = memory.weights + memory.grads + memory.optimizer
    name, gib = max(DEVICE_MEMORY_GIB.items(), key=lambda item: item[1])
    budget = gib * GIB * usable_fraction
    if static <= budget:
        return None
    return (f"rank {memory.rank} (pipeline stage {memory.pp_rank}) holds {static / GIB:.1f} GiB of weights, "
            f"gradients and optimizer state alone; no known device has that much ({name}: {budget / GIB:.1f} GiB "
            "usable): shard the model over more ranks (tensor or pipeline parallelism, the distributed "
            "optimizer, FSDP)")


@dataclass
class FlopsEstimate:
    per_token: float
    tokens_per_step: int
    per_step: float
    per_rank_per_step: float


def estimate_flops(model: ModelSpec, layout: ParallelLayout) -> FlopsEstimate:
    """Training FLOPs with ``primus.plan.flops`` (Megatron-LM's formula, the one every backend reports MFU with)."""
    per_token = flops_per_token(model, layout.seq_len)
    tokens = layout.effective_global_batch_size * layout.seq_len
    return FlopsEstimate(per_token, tokens, per_token * tokens, per_token * tokens / layout.world_size)


@dataclass
class Plan:
    params: ParamEstimate
    memory: MemoryEstimate
    flops: FlopsEstimate
    layout: dict[str, Any]
    device: str | None = None
    device_memory: int | None = None
    usable_fraction: float = 0.9
    ideal_step_seconds: float | None = None  # at 100% of the device's bf16 peak
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool | None:
        if self.device_memory is None:
            return None
        return self.memory.total <= self.device_memory * self.usable_fraction

    def to_dict(self) -> dict[str, Any]:
        return {"params": asdict(self.params), "memory": {**self.memory.components(),
                "activations_per_layer": self.memory.activations_per_layer,
                "layers_per_stage": self.memory.layers_per_stage,
                "microbatches_in_flight": self.memory.microbatches_in_flight,
                "flash_attention": self.memory.flash_attention},
                "flops": asdict(self.flops), "layout": self.layout, "device": self.device,
                "device_memory": self.device_memory, "usable_fraction": self.usable_fraction,
                "fits": self.fits, "ideal_step_seconds": self.ideal_step_seconds}


def make_plan(model: ModelSpec, layout: ParallelLayout, device: str | None = None, *,
              device_memory: int | None = None, usable_fraction: float = 0.9, flash_attention: bool = True) -> Plan:
    """Everything ``primus plan`` prints. ``device_memory`` (bytes) wins over the table."""
    if device and device_memory is None:
        device_memory = device_memory_bytes(device)
    flops = estimate_flops(model, layout)
    ideal = None
    key = device_key(device) if device else None
    if key and PEAK_TFLOPS[key].get("bf16"):
        ideal = flops.per_rank_per_step / (PEAK_TFLOPS[key]["bf16"] * 1e12)
    return Plan(estimate_params(model, layout), estimate_memory(model, layout, flash_attention=flash_attention),
                flops, layout.to_dict(), device, device_memory, usable_fraction, ideal)


def _recompute_mode(layout: dict[str, Any]) -> str:
    if layout.get("recompute"):
        return "full recompute"
    return "selective recompute" if layout.get("selective_recompute") else "no recompute"


def format_plan(plan: Plan) -> str:
    """The human table ``primus plan`` prints."""
    m = plan.memory
    p = plan.params
    active = f", {p.active:,} active per token" if p.active != p.total else ""
    lines = [f"parameters        {p.total:,} total{active}, {p.per_rank:,} per rank (heaviest stage)"]
    if p.mtp:
        lines.append(f"                  of the total, {p.mtp:,} in the multi-token-prediction layers "
                     f"({p.total - p.mtp:,} total, {p.active_without_mtp:,} active without them)")
    if p.per_rank_experts:
        lines.append(f"                  of each rank's, {p.per_rank_experts:,} routed-expert weights "
                     f"(ep={plan.layout['ep']}, etp={plan.layout['etp'] or plan.layout['tp']})")
    lines += [
        f"FLOPs per token   {plan.flops.per_token:.4g} (training, causal)",
        f"FLOPs per step    {plan.flops.per_step:.4g} ({plan.flops.tokens_per_step:,} tokens), "
        f"{plan.flops.per_rank_per_step:.4g} per rank",
        "memory per rank (GiB):",
    ]
    for name, value in m.components().items():
        lines.append(f"  {name:<14}{value / GIB:10.2f}")
    lines.append(f"  activations: {m.layers_per_stage} layers x {m.microbatches_in_flight} micro-batch(es) in flight x "
                 f"{m.activations_per_layer / 2**20:.1f} MiB/layer "
                 f"({_recompute_mode(plan.layout)}"
                 f"{', flash attention' if m.flash_attention else ''})")
    if plan.device_memory is not None:
        budget = plan.device_memory * plan.usable_fraction
        verdict = "fits" if plan.fits else "does NOT fit"
        lines.append(f"device {plan.device}: {plan.device_memory / GIB:.0f} GiB, usable {budget / GIB:.1f} GiB "
                     f"({plan.usable_fraction:.0%}): {verdict} ({m.total / budget:.0%} of usable)")
    if plan.ideal_step_seconds is not None:
        lines.append(f"ideal step time at bf16 peak: {plan.ideal_step_seconds * 1e3:.1f} ms")
    return "\n".join(lines)
