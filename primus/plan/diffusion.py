"""Parameters, FLOPs and per-rank memory of a Wan 2.x video diffusion transformer (T2V), no cluster needed.

Shapes are diffusers' ``WanTransformer3DModel`` config (``transformer/config.json``): ``num_layers``
blocks of width ``D = num_attention_heads x attention_head_dim``; Wan 2.2 A14B has two such
experts (high noise, low noise) of which one trains per run (``model.stage``).

Tokens per sample come from the latent shape. The VAE compresses a ``frames x height x width``
clip by 4 in time and 8 in space to ``[16, (frames-1)/4 + 1, height/8, width/8]``; patchify
``(1, 2, 2)`` makes ``S = f' x h'/2 x w'/2`` video tokens; the text encoder gives ``S_t`` tokens
(226 in Primus' latent cache, ``primus data wan-preprocess``).

Parameters (exact, a test checks it against diffusers on the meta device), per block:
    self- and cross-attention 2 x (4 D^2 + 4 D) + 4 D (q/k RMSNorms), FFN 2 D F + F + D,
    cross-attention LayerNorm 2 D, modulation table 6 D
  plus the patch embedding (Conv3d), time embedding (freq_dim -> D -> D, D -> 6 D), text
  projection (text_dim -> D -> D), output projection and modulation.

Training FLOPs per sample = 3 x forward (bidirectional attention: no causal discount), forward =
    per block: 2 S (6 D^2 + 2 D F) [q,k,v,o self; q,o cross; FFN] + 4 S_t D^2 [cross k,v]
               + 4 S^2 D [self-attention scores and values] + 4 S S_t D [cross-attention]
    plus 2 S D (C p + C p) for patch embedding and output projection, 2 S_t (T D + D^2) for the
    text projection and 2 (freq_dim D + 7 D^2) for the timestep embedding. A test checks the forward
    against torch's FlopCounterMode. Activation checkpointing adds one more forward (hardware
    FLOPs, not counted, as MFU conventions have it).

Memory per rank, bytes, FSDP2 over ``dp`` ranks (AutoModel's diffusion recipe):
    weights + grads + Adam m, v = P x (B(param) + B(param) + 8) / dp   (fp32: 16 bytes/parameter)
    gathered   = (1 + prefetch) x P_block x B(compute): unsharded blocks in flight
    activations per sample, eager, bf16 compute, fused SDPA (measured from the tensors autograd
    saves, a test checks it):
        per block      S (68 D + 4 F + 8 heads + 36) + S_t (14 D + 4)
        outside blocks 12 S D
    with per-block activation checkpointing each block keeps only its bf16 input (2 S D) and one
    block is recomputed at a time. Times ``micro_batch_size``.
    Not counted: the CUDA/HIP context, allocator fragmentation (``usable_fraction``), torch.compile
    fusions (which save less), communication buffers.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from primus.config.errors import ConfigError, did_you_mean
from primus.plan.devices import PEAK_TFLOPS, device_key
from primus.plan.layout import DTYPE_BYTES, LayoutIssue

GIB = 1024**3
# transformer/config.json of the published Wan 2.2 T2V A14B experts (both experts share it):
# huggingface.co/Wan-AI/Wan2.2-T2V-A14B-Diffusers, transformer/ and transformer_2/.
KNOWN_TRANSFORMERS: dict[str, dict[str, Any]] = {
    "Wan-AI/Wan2.2-T2V-A14B-Diffusers": dict(
        patch_size=[1, 2, 2], num_attention_heads=40, attention_head_dim=128, in_channels=16, out_channels=16,
        text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024),
}
EXPERTS = {"Wan-AI/Wan2.2-T2V-A14B-Diffusers": 2}


@dataclass(frozen=True)
class WanSpec:
    """The shapes of one Wan transformer (one expert)."""

    num_layers: int
    num_attention_heads: int
    attention_head_dim: int
    ffn_dim: int
    in_channels: int = 16
    out_channels: int = 16
    text_dim: int = 4096
    freq_dim: int = 256
    patch_size: tuple[int, int, int] = (1, 2, 2)
    cross_attn_norm: bool = True
    experts: int = 2  # Wan 2.2 A14B: transformer (high noise) and transformer_2 (low noise)
    name: str = "wan"

    @classmethod
    def from_transformer_config(cls, config: dict[str, Any], *, experts: int = 2, name: str = "wan") -> "WanSpec":
        """From diffusers' ``transformer/config.json`` (unknown keys such as ``eps`` are ignored)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in config.items() if k in known}
        values["patch_size"] = tuple(values.get("patch_size", (1, 2, 2)))
        values["out_channels"] = values.get("out_channels") or values.get("in_channels", 16)
        return cls(**values, experts=experts, name=name)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "WanSpec":
        return cls(**{**data, "patch_size": tuple(data["patch_size"])})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @property
    def patch_volume(self) -> int:
        return math.prod(self.patch_size)

    def block_params(self) -> int:
        d, f = self.dim, self.ffn_dim
        attention = 2 * (4 * d * d + 4 * d) + 4 * d
        return attention + (2 * d * f + f + d) + (2 * d if self.cross_attn_norm else 0) + 6 * d

    def outer_params(self) -> int:
        """Everything outside the blocks: patch/time/text embeddings, output projection and modulation."""
        d, p = self.dim, self.patch_volume
        patch = self.in_channels * p * d + d
        time = self.freq_dim * d + d + d * d + d + d * 6 * d + 6 * d
        text = self.text_dim * d + d + d * d + d
        out = d * self.out_channels * p + self.out_channels * p + 2 * d
        return patch + time + text + out

    def total_params(self) -> int:
        """One expert (the one a run trains)."""
        return self.num_layers * self.block_params() + self.outer_params()


@dataclass(frozen=True)
class ClipShape:
    """One training sample: a clip and its caption, as the latent cache holds it."""

    width: int
    height: int
    frames: int = 81
    text_tokens: int = 226
    source: str = "default"  # where width/height/frames came from, for the plan's first line

    def latent(self, spec: WanSpec) -> tuple[int, int, int, int]:
        """[channels, frames', height', width'] after the Wan VAE (4x time, 8x space)."""
        return (spec.in_channels, (self.frames - 1) // 4 + 1, self.height // 8, self.width // 8)

    def tokens(self, spec: WanSpec) -> int:
        _, f, h, w = self.latent(spec)
        pt, ph, pw = spec.patch_size
        return (f // pt) * (h // ph) * (w // pw)


@dataclass(frozen=True)
class DiffusionLayout:
    """How AutoModel's diffusion recipe splits a run: FSDP2 over dp ranks (no TP/PP for Wan here)."""

    dp: int = 1
    micro_batch_size: int = 1
    global_batch_size: int | None = None
    activation_checkpointing: bool = False
    param_dtype: str = "fp32"  # model.torch_dtype: the sharded master weights
    compute_dtype: str = "bf16"  # model.compute_dtype: FSDP2 MixedPrecisionPolicy.param_dtype
    prefetch: int = 1  # fsdp2_forward_prefetch_depth: blocks gathered ahead
    compiled: bool = False  # fsdp.enable_compile: fused blocks keep fewer activations than this eager estimate
    clip: ClipShape = field(default_factory=lambda: ClipShape(832, 480))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DiffusionLayout":
        return cls(**{**data, "clip": ClipShape(**data["clip"])})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def world_size(self) -> int:
        return self.dp

    @property
    def effective_global_batch_size(self) -> int:
        return self.global_batch_size or self.micro_batch_size * self.dp


def training_flops_per_sample(spec: WanSpec, clip: ClipShape) -> float:
    """Model FLOPs of one sample's forward and backward (3 x forward); see the module docstring."""
    s, st, d, f = clip.tokens(spec), clip.text_tokens, spec.dim, spec.ffn_dim
    block = 2 * s * (6 * d * d + 2 * d * f) + 4 * st * d * d + 4 * s * s * d + 4 * s * st * d
    outer = 2 * s * d * spec.patch_volume * (spec.in_channels + spec.out_channels) + 2 * st * (spec.text_dim * d + d * d)
    time = 2 * (spec.freq_dim * d + d * d + 6 * d * d)  # timestep embedding, once per sample
    return 3.0 * (spec.num_layers * block + outer + time)


def activation_bytes_per_block(spec: WanSpec, clip: ClipShape) -> int:
    """Bytes autograd keeps for one block and one sample (eager, bf16 compute, fused SDPA)."""
    s, st, d = clip.tokens(spec), clip.text_tokens, spec.dim
    return s * (68 * d + 4 * spec.ffn_dim + 8 * spec.num_attention_heads + 36) + st * (14 * d + 4)


@dataclass
class WanMemory:
    weights: int
    grads: int
    optimizer: int
    gathered: int
    activations: int
    activations_per_block: int

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.optimizer + self.gathered + self.activations

    def components(self) -> dict[str, int]:
        return {"weights": self.weights, "grads": self.grads, "optimizer": self.optimizer,
                "gathered": self.gathered, "activations": self.activations, "total": self.total}


def estimate_wan_memory(spec: WanSpec, layout: DiffusionLayout) -> WanMemory:
    params, dp = spec.total_params(), layout.dp
    param_bytes = DTYPE_BYTES[layout.param_dtype]
    weights = -(-params * param_bytes // dp)
    grads = -(-params * param_bytes // dp)
    optimizer = -(-params * 8 // dp)  # Adam m and v in fp32
    gathered = (1 + layout.prefetch) * spec.block_params() * DTYPE_BYTES[layout.compute_dtype]
    per_block = activation_bytes_per_block(spec, layout.clip)
    s, d = layout.clip.tokens(spec), spec.dim
    if layout.activation_checkpointing:
        per_sample = spec.num_layers * 2 * s * d + per_block + 12 * s * d
    else:
        per_sample = spec.num_layers * per_block + 12 * s * d
    return WanMemory(weights, grads, optimizer, gathered, per_sample * layout.micro_batch_size, per_block)


@dataclass
class WanPlan:
    spec: WanSpec
    layout: DiffusionLayout
    memory: WanMemory
    flops_per_sample: float
    device: str | None = None
    device_memory: int | None = None
    usable_fraction: float = 0.9
    ideal_step_seconds: float | None = None

    @property
    def flops_per_step(self) -> float:
        return self.flops_per_sample * self.layout.effective_global_batch_size

    @property
    def fits(self) -> bool | None:
        if self.device_memory is None:
            return None
        return self.memory.total <= self.device_memory * self.usable_fraction

    def to_dict(self) -> dict[str, Any]:
        clip = self.layout.clip
        return {"kind": "wan", "model": self.spec.to_dict(), "layout": self.layout.to_dict(),
                "params": {"per_expert": self.spec.total_params(), "experts": self.spec.experts,
                           "total": self.spec.total_params() * self.spec.experts,
                           "per_block": self.spec.block_params()},
                "tokens_per_sample": clip.tokens(self.spec), "latent_shape": list(clip.latent(self.spec)),
                "flops": {"per_sample": self.flops_per_sample, "per_step": self.flops_per_step,
                          "per_rank_per_step": self.flops_per_step / self.layout.world_size},
                "memory": {**self.memory.components(), "activations_per_block": self.memory.activations_per_block},
                "device": self.device, "device_memory": self.device_memory, "usable_fraction": self.usable_fraction,
                "fits": self.fits, "ideal_step_seconds": self.ideal_step_seconds}


def check_wan_layout(spec: WanSpec, layout: DiffusionLayout, world_size: int | None = None) -> list[LayoutIssue]:
    found: list[LayoutIssue] = []
    if world_size is not None and layout.dp != world_size:
        found.append(LayoutIssue("fail", f"fsdp dp_size ({layout.dp}) does not equal the world size {world_size}",
                                 {"dp": layout.dp, "world_size": world_size}))
    gbs, mbs = layout.effective_global_batch_size, layout.micro_batch_size
    if gbs % (mbs * layout.dp):
        found.append(LayoutIssue("fail", f"global_batch_size ({gbs}) is not divisible by local_batch_size x dp "
                                         f"({mbs} x {layout.dp} = {mbs * layout.dp})"))
    _, f, h, w = layout.clip.latent(spec)
    pt, ph, pw = spec.patch_size
    if (layout.clip.frames - 1) % 4:
        found.append(LayoutIssue("fail", f"frames ({layout.clip.frames}): the Wan VAE needs 4k+1 frames"))
    if h % ph or w % pw or layout.clip.height % 8 or layout.clip.width % 8:
        found.append(LayoutIssue("fail", f"resolution {layout.clip.width}x{layout.clip.height} does not patchify: "
                                         f"width and height must be multiples of {8 * max(ph, pw)}"))
    return found


def make_wan_plan(spec: WanSpec, layout: DiffusionLayout, device: str | None = None, *,
                  device_memory: int | None = None, usable_fraction: float = 0.9) -> WanPlan:
    from primus.plan.estimate import device_memory_bytes

    if device and device_memory is None:
        device_memory = device_memory_bytes(device)
    flops = training_flops_per_sample(spec, layout.clip)
    plan = WanPlan(spec, layout, estimate_wan_memory(spec, layout), flops, device, device_memory, usable_fraction)
    key = device_key(device) if device else None
    if key and PEAK_TFLOPS[key].get("bf16"):
        plan.ideal_step_seconds = plan.flops_per_step / layout.world_size / (PEAK_TFLOPS[key]["bf16"] * 1e12)
    return plan


def format_wan_plan(plan: WanPlan) -> str:
    spec, layout, m = plan.spec, plan.layout, plan.memory
    clip = layout.clip
    per_expert = spec.total_params()
    lines = [
        f"model             {spec.name}: {spec.num_layers} blocks, width {spec.dim}, ffn {spec.ffn_dim}, "
        f"{spec.experts} expert(s), one trains per run",
        f"parameters        {per_expert:,} per expert ({per_expert * spec.experts:,} for {spec.experts}), "
        f"{spec.block_params():,} per block",
        f"sample            {clip.frames} frames {clip.width}x{clip.height} ({clip.source}) -> latent "
        f"{list(clip.latent(spec))} -> {clip.tokens(spec):,} video tokens + {clip.text_tokens} text tokens",
        f"FLOPs per sample  {plan.flops_per_sample:.4g} (training = 3 x forward, bidirectional attention)",
        f"FLOPs per step    {plan.flops_per_step:.4g} ({layout.effective_global_batch_size} samples), "
        f"{plan.flops_per_step / layout.world_size:.4g} per rank",
        f"memory per rank (GiB), FSDP2 over {layout.dp} rank(s), {layout.param_dtype} master weights, "
        f"{layout.compute_dtype} compute:",
    ]
    for name, value in m.components().items():
        lines.append(f"  {name:<14}{value / GIB:10.2f}")
    ac = "activation checkpointing (each block keeps its input)" if layout.activation_checkpointing \
        else "no activation checkpointing"
    lines.append(f"  activations: {layout.micro_batch_size} sample(s) x {spec.num_layers} blocks, "
                 f"{m.activations_per_block / 2**20:.1f} MiB per block and sample when stored ({ac})")
    if layout.compiled:
        lines.append("  (eager estimate: with fsdp.enable_compile the compiled blocks keep fewer activations)")
    if plan.device_memory is not None:
        budget = plan.device_memory * plan.usable_fraction
        verdict = "fits" if plan.fits else "does NOT fit"
        lines.append(f"device {plan.device}: {plan.device_memory / GIB:.0f} GiB, usable {budget / GIB:.1f} GiB "
                     f"({plan.usable_fraction:.0%}): {verdict} ({m.total / budget:.0%} of usable)")
    if plan.ideal_step_seconds is not None:
        lines.append(f"ideal step time at bf16 peak: {plan.ideal_step_seconds * 1e3:.1f} ms")
    return "\n".join(lines)


def known_name(name: str) -> str | None:
    """The published model ``name`` is: its Hub id, or a snapshot folder named after it (AMD Primus's
    ``/models/Wan2.2-T2V-A14B-Diffusers``, a cluster path absent on the host that plans)."""
    if name in KNOWN_TRANSFORMERS:
        return name
    folder = name.rstrip("/").rsplit("/", 1)[-1]
    return next((hub for hub in KNOWN_TRANSFORMERS if "/" in name and hub.rsplit("/", 1)[-1] == folder), None)


def known_transformer(name: str) -> dict[str, Any] | None:
    known = known_name(name)
    return KNOWN_TRANSFORMERS[known] if known else None


def unknown_model_error(where: str, name: str) -> ConfigError:
    return ConfigError(f"{where}: cannot plan '{name}': no transformer/config.json there and not a known model"
                       f"{did_you_mean(name, KNOWN_TRANSFORMERS)} (known: {', '.join(KNOWN_TRANSFORMERS)}); "
                       "point it at a local pipeline snapshot")
