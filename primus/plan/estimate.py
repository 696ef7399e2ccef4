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

Memory per rank, bytes (``N`` = parameters per rank, of which ``E`` routed-expert weights;
``D`` = dp x cp, ``D_e`` = the expert-data-parallel size tp x dp x cp / (ep x etp); B(x) = bytes of dtype x)
    shard(b)   = (N - E) * b / D + E * b / D_e
    weights    = N * B(param_dtype), or shard(B(param_dtype)) if sharding == fsdp
    grads      = N * B(grad_dtype),  or shard(B(grad_dtype))  if sharding == fsdp
    optimizer  = per-parameter bytes 4 [fp32 master, when param_dtype is not fp32 and master_weights]
                 + 2 * B(optimizer_dtype) [Adam m and v], times N, or shard(...) if sharding in (optimizer, fsdp)
    e.g. mixed-precision Adam: 2 + 4 + (4 + 2*4) = 18 bytes per parameter, unsharded (Megatron-LM's
    theoretical_memory_usage.py: 18, or 6 + 12 / dp with the distributed optimizer).

    activations, per layer per micro-batch (Korthikanti et al. 2022, "Reducing Activation
    Recomputation in Large Transformer Models"; s = seq_len / cp, b = micro_batch_size,
    h = dim, a = n_heads, t = tp, sequence parallelism assumed, 16-bit activations):
        no recompute:    s * b * h * (34 + 5 * a * s / h) / t
        full recompute:  2 * s * b * h / t          (only each layer's input is kept)
    With ``flash_attention`` (the default; TorchTitan and Megatron both use fused attention)
    the ``5*a*s/h`` term, the stored softmax scores, is dropped: they are recomputed.
    The 34 was derived for GPT (4h MLP, MHA, dropout); for Llama it is an approximation, and for
    MoE layers a rough one (the top-k copies of each routed token are not modelled).
    Times layers per stage, times micro-batches in flight on the first stage under 1F1B
    (``min(pp, num_microbatches)``), plus the fp32 logits ``4 * s * b * vocab / t``.
    Summing first-stage activations and last-stage logits is an upper bound when pp > 1.

    Not counted: the CUDA/HIP context and allocator fragmentation (hence the
    ``memory.usable_fraction`` threshold), FSDP's transiently gathered layer, and
    communication buffers.
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
                 f"({'full recompute' if plan.layout['recompute'] else 'no recompute'}"
                 f"{', flash attention' if m.flash_attention else ''})")
    if plan.device_memory is not None:
        budget = plan.device_memory * plan.usable_fraction
        verdict = "fits" if plan.fits else "does NOT fit"
        lines.append(f"device {plan.device}: {plan.device_memory / GIB:.0f} GiB, usable {budget / GIB:.1f} GiB "
                     f"({plan.usable_fraction:.0%}): {verdict} ({m.total / budget:.0%} of usable)")
    if plan.ideal_step_seconds is not None:
        lines.append(f"ideal step time at bf16 peak: {plan.ideal_step_seconds * 1e3:.1f} ms")
    return "\n".join(lines)
