"""Step-time projection: how long one training step of a layout takes on a device, and why.

Per micro-batch, per pipeline stage, every layer is costed op by op on one rank:

* GEMMs (QKV, attention output, MLP or the routed/shared experts, router, LM head) by the roofline:
  ``max(2mnk / (peak x gemm efficiency), bytes / (HBM x hbm efficiency))`` plus a kernel overhead; the
  backward pass is two GEMMs of the same size (data and weight gradients). ``fp8`` runs the layers'
  linears (not the LM head) at the fp8 peak, and pays the casts as memory traffic.
* Fused attention: ``2 b s_q s_kv heads (d_qk + d_v)`` FLOPs forward (halved by the causal mask),
  2.5x that backward (flash attention recomputes the scores), at the profile's attention efficiency.
* Memory-bound ops (norms, residual adds, RoPE, the gated activation, MoE permutation, the loss):
  bytes moved / (HBM x efficiency); eager PyTorch (``fused_elementwise: false``) moves ~3x the bytes of
  fused kernels (TE, Apex, torch.compile).
* Recompute: ``full`` runs each layer's forward twice, ``selective`` (Megatron-LM) the attention core
  twice, ``op`` (TorchTitan's per-op selective checkpointing) every second linear and the elementwise ops.

Communication (``primus.plan.comm``, ring model, intra- vs inter-node links):
* TP: with sequence parallelism 2 all-gathers + 2 reduce-scatters of ``b s h`` per layer forward and
  again backward (else 2 + 2 all-reduces); exposed unless ``tp_comm_overlap`` (then 20% exposed).
* CP: ring attention passes K/V ``cp - 1`` times per layer (forward, twice that backward), overlapped
  with the attention it feeds: only the excess is exposed.
* EP: 2 all-to-alls (dispatch, combine) per MoE layer forward, 2 backward; exposed.
* PP: a send/recv of ``b s h`` per micro-batch and virtual stage each way; the 1F1B bubble is
  ``(pp - 1) / vpp`` micro-batch times of the slowest stage.
* DP: gradient all-reduce (``sharding: none``), reduce-scatter + parameter all-gather (distributed
  optimizer), or per micro-batch all-gather (forward and backward) + reduce-scatter (FSDP, one per wrapped
  unit; FSDP2 also copies shards and gradients through its buffers). Overlapped with backward (and forward
  for gathers) where the engine overlaps them; what exceeds it is exposed.
* Optimizer: Adam touches ~38 bytes per local parameter (fp32 master, moments, gradient, bf16 copy, the
  gradient-norm read), memory-bound; a profile that measured an eager AdamW step (a CPU) gives its time.

``step = micro-batches x slowest stage's micro-batch time + bubble + exposed PP and DP traffic + optimizer``.
MFU uses the Megatron-LM FLOP convention (``primus.plan.flops``) and the bf16 peak (an fp32 run's: the fp32
peak, as a CPU run's own MFU line).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from primus.config.errors import ConfigError
from primus.plan.comm import Group, Groups, collective_seconds
from primus.plan.estimate import estimate_memory, estimate_params
from primus.plan.flops import flops_per_token
from primus.plan.layout import DTYPE_BYTES, ParallelLayout
from primus.plan.model import ModelSpec
from primus.plan.profiles import DeviceProfile

RECOMPUTE = ("none", "selective", "op", "full")
UNFUSED_TRAFFIC = 3.0  # eager PyTorch: a norm or activation is several kernels, each a pass over memory
TP_OVERLAP_EXPOSED = 0.2  # share of TP traffic left exposed with tp_comm_overlap / async TP
ADAM_BYTES_PER_PARAM = 38
FLASH_BACKWARD = 2.5  # flash attention backward FLOPs over forward


@dataclass(frozen=True)
class ProjectionOptions:
    """What the layout alone does not say, read from the engine's settings (``projection_options``)."""

    vpp: int = 1  # virtual pipeline stages per rank (interleaved 1F1B)
    gemm_dtype: str = "bf16"  # bf16 | fp8 | fp32: the transformer layers' linears
    expert_gemm_dtype: str | None = None  # the routed experts' GEMMs where an engine fixes them (None: gemm_dtype)
    grouped_experts: bool = False  # the routed experts run as one grouped GEMM (torch._grouped_mm), not a loop
    fsdp_copies: bool = False  # FSDP2 (TorchTitan): gathers copy the shards in and out, reduces copy the gradients
    loss_parallel: bool = False  # TP: the loss over vocab-sharded logits, 3 all-reduces per loss chunk
    norm_grad_allreduce: bool = False  # TP: each norm weight's gradient all-reduced on its own (DTensor Partial)
    ep_probs_alltoall: bool = False  # EP: the routing weights get their own all-to-all beside the tokens (Megatron)
    ep_count_exchange: str | None = None  # EP: tokens per expert exchanged each MoE layer: allgather | alltoall
    step_allreduces: int = 0  # the engine's small all-reduces over the data-parallel ranks a step (loss, token counts)
    grad_norm_group: str = "model"  # the gradient norm's all-reduce: model (tp x pp, + ep for experts) | world
    optimizer_foreach: bool = False  # AdamW as torch's foreach implementation (TorchTitan's), else its for-loop
    recompute: str | None = None  # none | selective | full; None = the layout's (full or none)
    sequence_parallel: bool = True
    fused_elementwise: bool = True
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    tp_comm_overlap: bool = False
    pp_microbatch_size: int | None = None  # TorchTitan: pipeline micro-batch (else the layout's micro-batch)
    causal: bool = True
    attention: str = "fused"  # fused (cuDNN/TE, aiter: Megatron) | sdpa (PyTorch's flash attention 2: TorchTitan)

    def __post_init__(self) -> None:
        if self.recompute is not None and self.recompute not in RECOMPUTE:
            raise ConfigError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        if self.gemm_dtype not in ("bf16", "fp16", "fp8", "fp32"):
            raise ConfigError(f"gemm_dtype must be bf16, fp16, fp8 or fp32, got {self.gemm_dtype!r}")
        if not isinstance(self.vpp, int) or self.vpp < 1:
            raise ConfigError(f"vpp must be a positive integer, got {self.vpp!r}")


@dataclass
class Projection:
    step_time: float
    tokens_per_sec_per_gpu: float
    samples_per_sec_per_gpu: float
    mfu: float  # of the bf16 dense peak
    memory_gb: float  # per rank, the plan's estimate (1e9 bytes)
    breakdown: dict[str, float]  # seconds per step: compute, exposed comms by kind, bubble, optimizer
    device: str
    world_size: int
    microbatches: int
    assumptions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """The machine-readable line, in the seed's ``[TRAIN]`` style."""
        return (f"projected: step_time={self.step_time:.3f}s tokens_per_sec_per_gpu={self.tokens_per_sec_per_gpu:.1f} "
                f"samples_per_sec_per_gpu={self.samples_per_sec_per_gpu:.3f} mfu={100 * self.mfu:.2f}% "
                f"mem={self.memory_gb:.2f}GB")


class _Costs:
    """Seconds per op kind on one rank, for one micro-batch."""

    def __init__(self, profile: DeviceProfile, act_bytes: int, gemm_dtype: str, fused: bool, attention: str = "fused"):
        self.p, self.eff = profile, profile.efficiency
        self.attention_eff = self.eff.attention_sdpa if attention == "sdpa" else self.eff.attention
        self.act, self.gemm_dtype, self.fused = act_bytes, gemm_dtype, fused
        self.attention_dtype = "fp32" if gemm_dtype == "fp32" else "bf16"  # fp8 runs keep attention in bf16
        self.hbm = profile.hbm_gbps * 1e9 * self.eff.hbm

    def gemm(self, m: float, k: float, n: float, dtype: str | None = None, grouped: bool = False) -> float:
        """One forward GEMM (m x k) @ (k x n); ``grouped``: one expert's share of a grouped GEMM, at the
        profile's grouped rate where it measured one."""
        if m <= 0 or k <= 0 or n <= 0:
            return 0.0
        dtype = dtype or self.gemm_dtype
        fp8 = dtype == "fp8"
        if grouped and self.p.grouped_gemm_tflops.get(dtype):  # measured as a training step runs it
            rate = self.p.grouped_peak(dtype)
        else:
            rate = self.p.peak(dtype) * (self.eff.gemm_fp8 if fp8 else self.eff.gemm)
        elem = 1 if fp8 else DTYPE_BYTES.get(dtype, 2)
        moved = (m * k + k * n) * elem + m * n * self.act
        seconds = max(2 * m * k * n / rate, moved / self.hbm) + self.eff.kernel_overhead_s
        if fp8:  # quantise the activation and the weight (read 16-bit, write 8-bit)
            seconds += self.memory((m * k + k * n) * (self.act + 1), fused=True)
        return seconds

    def memory(self, nbytes: float, *, fused: bool | None = None, kernels: int = 1) -> float:
        traffic = nbytes * (1.0 if (self.fused if fused is None else fused) else UNFUSED_TRAFFIC)
        return traffic / self.hbm + kernels * self.eff.kernel_overhead_s

    def attention(self, flops: float) -> float:
        return flops / (self.p.peak(self.attention_dtype) * self.attention_eff) + self.eff.kernel_overhead_s


def _layer_seconds(model: ModelSpec, layout: ParallelLayout, opts: ProjectionOptions, c: _Costs,
                   mbs: int, moe: bool) -> dict[str, float]:
    """One layer, one micro-batch, one rank: forward, backward and recompute compute, exposed comms."""
    t, cp = layout.tp, layout.cp
    s = layout.seq_len // cp
    T = mbs * s  # tokens of this rank's micro-batch (before the TP split of sequence parallelism)
    h, A = model.dim, c.act
    sp = opts.sequence_parallel and t > 1
    q, kv, v = model.n_heads * model.head_dim, model.kv_heads * model.head_dim, model.n_heads * model.head_dim
    d_qk = model.head_dim
    if model.is_mla:
        d_qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        q, v = model.n_heads * d_qk, model.n_heads * model.v_head_dim
        kv = model.kv_lora_rank + model.qk_rope_head_dim
    gated = 3 if model.swiglu else 2

    # attention block GEMMs
    if model.is_mla:
        fwd_gemm = (c.gemm(T, h, (model.q_lora_rank or 0)) + c.gemm(T, model.q_lora_rank or h, q / t)
                    + c.gemm(T, h, kv) + c.gemm(T, model.kv_lora_rank, model.n_heads * (model.qk_nope_head_dim + model.v_head_dim) / t)
                    + c.gemm(T, v / t, h))
    else:
        fwd_gemm = c.gemm(T, h, (q + 2 * kv) / t) + c.gemm(T, q / t, h)
    # MLP / experts
    k_act = 0.0
    if moe:
        E, k = model.n_experts, model.top_k
        fe = model.expert_ffn_dim
        etp = layout.expert_tp
        tokens_here = T * k * etp / t  # routed copies this rank's experts process (balanced routing)
        local = max(1, E // layout.ep)
        m_e = tokens_here / local
        fwd_gemm += c.gemm(T, h, E, c.attention_dtype)  # router: never fp8
        experts, grouped = opts.expert_gemm_dtype, opts.grouped_experts
        fwd_gemm += local * (c.gemm(m_e, h, (gated - 1) * fe / etp, experts, grouped)
                             + c.gemm(m_e, fe / etp, h, experts, grouped))
        if model.shared_expert_ffn_hidden_size:
            sh = model.shared_expert_ffn_hidden_size
            fwd_gemm += c.gemm(T, h, (gated - 1) * sh / t) + c.gemm(T, sh / t, h)
            k_act += 3 * sh / t * T
        k_act += (3 if gated == 3 else 2) * tokens_here * fe / etp + 4 * tokens_here * h  # act + permute/unpermute
    else:
        f = model.ffn_dim
        fwd_gemm += c.gemm(T, h, (gated - 1) * f / t) + c.gemm(T, f / t, h)
        k_act += (3 if gated == 3 else 2) * T * f / t
    # fused attention core
    mask = 0.5 if opts.causal else 1.0
    attn_flops = 2 * mbs * s * layout.seq_len * (model.n_heads / t) * (d_qk + v / model.n_heads) * mask
    fwd_attn = c.attention(attn_flops)
    bwd_attn = c.attention(FLASH_BACKWARD * attn_flops)
    # memory-bound: 2 norms (r+w), 2 residual adds (2r+w) on T/t tokens under SP; RoPE on q, k
    norm_res = 10 * h * T / (t if sp else 1)
    elem = (norm_res + 2 * (q + kv) / t * T + k_act) * A
    fwd_elem = c.memory(elem, kernels=8)
    fwd = fwd_gemm + fwd_attn + fwd_elem
    bwd = 2 * fwd_gemm + bwd_attn + 2 * fwd_elem
    recompute = opts.recompute or ("full" if layout.recompute else "none")
    extra = {"full": fwd, "selective": fwd_attn, "op": fwd_gemm / 2 + fwd_elem}.get(recompute, 0.0)

    # communication of this layer
    g = Groups.of(tp=t, cp=cp, dp=layout.dp, pp=layout.pp, ep=layout.ep, etp=layout.expert_tp)
    gpn = c.p.gpus_per_node
    act_msg = T * h * A
    if sp:
        one_pass = 2 * (collective_seconds("allgather", act_msg, g.tp, c.p, gpn)
                        + collective_seconds("reducescatter", act_msg, g.tp, c.p, gpn))
    else:
        one_pass = 2 * collective_seconds("allreduce", act_msg, g.tp, c.p, gpn)
    passes = 2 + (1 if recompute == "full" else 0)
    tp_comm = passes * one_pass * (TP_OVERLAP_EXPOSED if opts.tp_comm_overlap else 1.0)
    cp_comm = 0.0
    if cp > 1:
        kv_chunk = 2 * mbs * s * (model.kv_heads / t) * model.head_dim * A
        ring = (cp - 1) * collective_seconds("sendrecv", kv_chunk, g.cp, c.p, gpn)
        cp_comm = max(0.0, ring - fwd_attn) + max(0.0, 2 * ring - bwd_attn)
    ep_comm = 0.0
    if moe and layout.ep > 1:
        routed = T * model.top_k * layout.expert_tp / t
        tokens = collective_seconds("alltoall", routed * h * A, g.ep, c.p, gpn)  # dispatch or combine
        # Megatron's dispatcher sends the routing weights (fp32) in an all-to-all of their own
        probs = collective_seconds("alltoall", routed * 4, g.ep, c.p, gpn) if opts.ep_probs_alltoall else 0.0
        counts = 0.0  # tokens per expert (int64), exchanged before the dispatch
        if opts.ep_count_exchange == "allgather":  # Megatron: over the tp x ep group
            counts = collective_seconds("allgather", model.n_experts * 8 * t * layout.ep, Group(t * layout.ep, 1),
                                        c.p, gpn)
        elif opts.ep_count_exchange == "alltoall":  # TorchTitan
            counts = collective_seconds("alltoall", model.n_experts * 8, g.ep, c.p, gpn)
        forward = 2 * tokens + probs + counts
        ep_comm = forward + 2 * tokens + probs + (forward if recompute == "full" else 0.0)
    return {"gemm": 3 * fwd_gemm + {"full": fwd_gemm, "op": fwd_gemm / 2}.get(recompute, 0.0),
            "attention": fwd_attn + bwd_attn + (fwd_attn if recompute in ("full", "selective") else 0.0),
            "elementwise": 3 * fwd_elem + (fwd_elem if recompute in ("full", "op") else 0.0),
            "compute": fwd + bwd + extra, "tp": tp_comm, "cp": cp_comm, "ep": ep_comm}


def _head_seconds(model: ModelSpec, layout: ParallelLayout, opts: ProjectionOptions, c: _Costs,
                  mbs: int) -> dict[str, float]:
    """LM head forward + backward, the cross-entropy and the embedding, one micro-batch (last stage)."""
    T = mbs * layout.seq_len // layout.cp
    V, t = model.vocab_size, layout.tp
    head = 3 * c.gemm(T, model.dim, V / t, "bf16" if opts.gemm_dtype == "fp8" else None)
    loss = c.memory(6 * T * V / t * 4, kernels=6)  # fp32 logits: softmax, loss and its gradient
    embedding = c.memory(4 * T * model.dim * c.act)  # lookup and its gradient
    tp = 0.0
    if opts.loss_parallel and t > 1:  # max, sum of exponentials, target logit: per loss chunk, one value a token
        g = Groups.of(tp=t, cp=layout.cp, dp=layout.dp, pp=layout.pp, ep=layout.ep, etp=layout.expert_tp)
        tp = 3 * max(1, layout.loss_chunks) * collective_seconds("allreduce", T * 4 / max(1, layout.loss_chunks),
                                                                  g.tp, c.p, c.p.gpus_per_node)
    return {"compute": head + loss + embedding, "gemm": head, "attention": 0.0, "elementwise": loss + embedding,
            "tp": tp, "cp": 0.0, "ep": 0.0}


def project(model: ModelSpec, layout: ParallelLayout, profile: DeviceProfile,
            opts: ProjectionOptions | None = None) -> Projection:
    """Project one step of ``layout`` on ``profile`` (see the module docstring for the model)."""
    opts = opts or ProjectionOptions()
    if opts.vpp > 1 and layout.pp == 1:
        raise ConfigError("virtual pipeline stages (vpp > 1) need pipeline parallelism (pp > 1)")
    act = DTYPE_BYTES[layout.compute_dtype if layout.compute_dtype != "fp8" else "bf16"]
    gemm_dtype = opts.gemm_dtype if layout.compute_dtype != "fp32" else "fp32"
    c = _Costs(profile, act, gemm_dtype, opts.fused_elementwise, opts.attention)
    mbs = opts.pp_microbatch_size or layout.micro_batch_size
    per_dp_rank = layout.effective_global_batch_size // layout.dp
    microbatches = max(1, per_dp_rank // mbs)

    pattern = model.moe_layer_pattern()
    dense = _layer_seconds(model, layout, opts, c, mbs, moe=False)
    moe = _layer_seconds(model, layout, opts, c, mbs, moe=True) if model.is_moe else dense
    head = _head_seconds(model, layout, opts, c, mbs)
    if profile.efficiency.compute != 1.0:  # measured: an eager step's compute over its projection (CPU)
        dense, moe, head = (_slowed(cost, profile.efficiency.compute) for cost in (dense, moe, head))
    stage_ids = layout.stage_layer_ids(model.n_layers)
    keys = ("compute", "tp", "cp", "ep", "gemm", "attention", "elementwise")
    stages = []
    for i, ids in enumerate(stage_ids):
        cost = {key: sum((moe if pattern[j] else dense)[key] for j in ids) for key in keys}
        if i == len(stage_ids) - 1:
            mtp = moe if model.mtp_layer_is_moe else dense
            cost = {key: cost[key] + head[key] + model.mtp_layers * mtp[key] for key in keys}
        stages.append(cost)
    slowest = max(stages, key=lambda s: s["compute"] + s["tp"] + s["cp"] + s["ep"])
    per_mb = slowest["compute"] + slowest["tp"] + slowest["cp"] + slowest["ep"]

    g = Groups.of(tp=layout.tp, cp=layout.cp, dp=layout.dp, pp=layout.pp, ep=layout.ep, etp=layout.expert_tp)
    gpn = profile.gpus_per_node
    pp, vpp = layout.pp, opts.vpp
    bubble = (pp - 1) / vpp * per_mb if pp > 1 else 0.0
    sp = opts.sequence_parallel and layout.tp > 1
    boundary = mbs * layout.seq_len // layout.cp * model.dim * act / (layout.tp if sp else 1)
    pp_comm = 2 * microbatches * vpp * collective_seconds("sendrecv", boundary, g.pp, profile, gpn) if pp > 1 else 0.0

    dp_comm, optimizer = _data_parallel(model, layout, opts, c, g, microbatches, slowest)
    dp_comm += _step_bookkeeping(model, layout, opts, g, profile)
    compute = microbatches * slowest["compute"]
    step = compute + microbatches * (slowest["tp"] + slowest["cp"] + slowest["ep"]) + bubble + pp_comm + dp_comm + optimizer
    world = layout.world_size
    tokens = layout.effective_global_batch_size * layout.seq_len
    flops = flops_per_token(model, layout.seq_len) * tokens
    memory = estimate_memory(model, layout).total / 1e9
    breakdown = {"compute": compute, "gemm": microbatches * slowest["gemm"],
                 "attention": microbatches * slowest["attention"],
                 "elementwise": microbatches * slowest["elementwise"],
                 "tp_comm": microbatches * slowest["tp"], "cp_comm": microbatches * slowest["cp"],
                 "ep_comm": microbatches * slowest["ep"], "pp_comm": pp_comm, "dp_comm": dp_comm,
                 "bubble": bubble, "optimizer": optimizer}
    return Projection(step, tokens / step / world, layout.effective_global_batch_size / step / world,
                      flops / step / world / profile.peak(c.attention_dtype), memory, breakdown, profile.name, world,
                      microbatches, _assumptions(opts, layout))


def _slowed(cost: dict[str, float], efficiency: float) -> dict[str, float]:
    """A layer's or the head's compute at ``efficiency``; its communication as it was."""
    return {key: value / efficiency if key in ("compute", "gemm", "attention", "elementwise") else value
            for key, value in cost.items()}


def _data_parallel(model, layout, opts, c: _Costs, g: Groups, microbatches: int, slowest) -> tuple[float, float]:
    """(exposed data-parallel seconds, optimizer seconds) per step."""
    params = estimate_params(model, layout)
    dense, experts = params.per_rank - params.per_rank_experts, params.per_rank_experts
    p, gpn = c.p, c.p.gpus_per_node
    grad_b, param_b = DTYPE_BYTES[layout.grad_dtype], DTYPE_BYTES[layout.compute_dtype]  # gathered as computed

    def coll(op: str, count: int, nbytes: int, expert: bool = False) -> float:
        return collective_seconds(op, count * nbytes, g.expert_grad if expert else g.grad, p, gpn)

    hidden_by = 1.0 if p.overlaps_comm else 0.0  # a CPU's collectives share its cores: none hide behind compute
    backward = slowest["compute"] * 2 / 3 * hidden_by
    forward = slowest["compute"] / 3 * hidden_by
    if layout.sharding == "fsdp":  # per micro-batch: gather for forward and backward, scatter gradients
        units = model.n_layers + 2  # one collective per block, the embedding, the final norm with the head
        gather = units * (coll("allgather", dense / units, param_b) + coll("allgather", experts / units, param_b, True))
        scatter = units * (coll("reducescatter", dense / units, grad_b)
                           + coll("reducescatter", experts / units, grad_b, True))
        per_mb = max(0.0, gather - forward) + max(0.0, gather + scatter - backward)
        if opts.fsdp_copies:  # FSDP2: copy-in of the shard and copy-out of the whole, twice; the gradients
            # copied into the reduce buffer, divided by the world, the shard copied out (each a read and a write)
            n = g.grad.size
            moved = 2 * 2 * (dense + experts) * (1 + 1 / n) * param_b + 2 * (dense + experts) * (2 + 1 / n) * grad_b
            per_mb += c.memory(moved, fused=True, kernels=4 * units)
        exposed = microbatches * per_mb + gather / units  # the first layer's gather
        shards, expert_shards = g.grad.size, g.expert_grad.size
    else:
        if layout.sharding == "optimizer":
            reduce = coll("reducescatter", dense, grad_b) + coll("reducescatter", experts, grad_b, True)
            gather = coll("allgather", dense, param_b) + coll("allgather", experts, param_b, True)
            shards, expert_shards = g.grad.size, g.expert_grad.size
        else:
            reduce = coll("allreduce", dense, grad_b) + coll("allreduce", experts, grad_b, True)
            gather = 0.0
            shards = expert_shards = 1
        if opts.overlap_grad_reduce:
            reduce = max(0.0, reduce - backward) + reduce / max(1, model.n_layers)  # the last bucket waits
        if opts.overlap_param_gather:
            gather = max(0.0, gather - forward) + gather / max(1, model.n_layers)
        exposed = reduce + gather
    local = dense / shards + experts / expert_shards
    if p.optimizer_s_per_param:  # measured: an eager AdamW step on this host, as the engine implements it
        foreach = opts.optimizer_foreach and p.optimizer_foreach_s_per_param
        optimizer = local * (p.optimizer_foreach_s_per_param if foreach else p.optimizer_s_per_param)
    else:
        optimizer = c.memory(ADAM_BYTES_PER_PARAM * local, fused=True, kernels=20)
    if opts.norm_grad_allreduce and layout.tp > 1:  # two norms a layer and the final one, each on its own
        norms = 2 * model.n_layers // max(1, layout.pp) + 1
        exposed += norms * collective_seconds("allreduce", model.dim * grad_b, g.tp, p, gpn)
    return exposed, optimizer


def _step_bookkeeping(model, layout, opts: ProjectionOptions, g: Groups, profile: DeviceProfile) -> float:
    """Small all-reduces once a step, latency-bound: Primus's stop flag over every rank, the engine's loss
    and token counts over the data-parallel ranks, the gradient norm over the ranks that split the model."""
    def tiny(size: int) -> float:
        return collective_seconds("allreduce", 8, Group(size, 1), profile, profile.gpus_per_node)

    world = layout.world_size
    seconds = tiny(world) + opts.step_allreduces * tiny(g.grad.size)
    if opts.grad_norm_group == "world":
        seconds += tiny(world)
    else:
        seconds += tiny(layout.tp * layout.pp) + (tiny(layout.ep * layout.pp) if model.is_moe else 0.0)
    return seconds


def _assumptions(opts: ProjectionOptions, layout: ParallelLayout) -> list[str]:
    said = [f"linears in {opts.gemm_dtype}, activations in {layout.compute_dtype}",
            f"recompute {opts.recompute or ('full' if layout.recompute else 'none')}",
            "fused elementwise kernels" if opts.fused_elementwise else "eager elementwise kernels (~3x traffic)"]
    if layout.tp > 1:
        said.append(f"TP traffic {'20% exposed (overlapped)' if opts.tp_comm_overlap else 'exposed'}"
                    f"{', sequence parallel' if opts.sequence_parallel else ''}")
    if layout.dp * layout.cp > 1:
        said.append("DP gradient traffic overlapped with backward" if opts.overlap_grad_reduce or layout.sharding == "fsdp"
                    else "DP gradient traffic exposed")
    if layout.pp > 1:
        said.append(f"1F1B{' interleaved x' + str(opts.vpp) if opts.vpp > 1 else ''}: bubble (pp-1)/vpp micro-batches")
    if layout.ep > 1:
        said.append("balanced expert routing, all-to-all exposed")
    return said
