"""LoRA adapters on megatron-core's tensor-parallel linears (AMD Primus's ``lora:`` block).

``y = base(x) + (alpha / dim) * B(A(dropout(x)))``, with every base parameter frozen: only the
adapters train. Tensor parallel follows the base layer:

* ``ColumnParallelLinear`` (``linear_qkv``, ``linear_fc1``): A (in -> r) is replicated, B
  (r -> out/tp) is split by output rows like the base weight; the low-rank activation's gradient
  is all-reduced over TP (``copy_to_tensor_model_parallel_region``) so A's gradient is whole on
  every rank; the base's ``gather_output`` is honoured.
* ``RowParallelLinear`` (``linear_proj``, ``linear_fc2``): A (in/tp -> r) is split by input
  columns, its partial output all-reduced over TP (``reduce_from_tensor_model_parallel_region``);
  B (r -> out) is replicated.

Adapters are drawn on the full (unsplit) matrix from a generator seeded by ``seed`` and the
layer's global name, then this rank's shard is kept: a TP=2 run starts from the same adapters
as a 1-rank run.

The wrapper registers the base's own parameters under the base's names (the base module is held
aside, not as a child), so state-dict and checkpoint keys of the base weights are unchanged
(``...linear_fc1.weight``, with megatron-core's SwiGLU checkpoint layout) and the adapters sit
beside them (``...linear_fc1.lora_A.weight``). ``primus export`` merges ``W + scale * B @ A``.

Not adapted: the routed experts' linears of MoE layers (megatron-core's ``is_expert``: another
TP group and expert-parallel grads) are left frozen, and said so in the log; shared experts and
dense MLPs are adapted. Sequence parallelism and Transformer Engine's fused layer-norm linears
are not supported with LoRA (the run refuses SP; the trainer uses the local layer spec).
"""
from __future__ import annotations

import math
import zlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from primus.config.errors import ConfigError, did_you_mean

TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
MAX_RANK = 2**16  # a rank beyond any model's width; the model's own bound is check_rank's
_COLUMN = ("linear_qkv", "linear_fc1")


class LoRAConfig(BaseModel):
    """The ``lora`` block, AMD Primus's keys and defaults (``sft_trainer.yaml``)."""

    model_config = ConfigDict(extra="forbid")

    # strict: `dim: true` or `alpha: "32"` is a mistake, not a value to coerce; finite, bounded numbers
    enabled: bool = Field(False, strict=True)
    dim: int = Field(32, gt=0, le=MAX_RANK, strict=True, description="rank r (also ≤ min(in, out) of every "
                                                                     "adapted linear: check_rank)")
    alpha: float = Field(32, gt=0, le=1e6, strict=True, allow_inf_nan=False, description="scaling = alpha / dim")
    dropout: float = Field(0.0, ge=0, lt=1, strict=True, allow_inf_nan=False)
    dropout_position: Literal["pre", "post"] = "pre"
    lora_A_init_method: Literal["xavier", "kaiming"] = "xavier"
    lora_B_init_method: Literal["zero", "xavier", "kaiming"] = "zero"
    target_modules: list[Literal["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]] = Field(
        default_factory=lambda: list(TARGETS), min_length=1)

    @property
    def scale(self) -> float:
        return self.alpha / self.dim

    def describe(self) -> str:
        return f"rank {self.dim}, alpha {self.alpha:g}, targets {', '.join(self.target_modules)}"


def parse_lora(value: Any, prefix: str, where: str = "") -> LoRAConfig:
    """The block as a ``LoRAConfig``; a wrong key or value is one ``ConfigError`` naming ``prefix.key``."""
    where = f"{where}: " if where else ""
    if value is None:
        return LoRAConfig()
    if not isinstance(value, dict):
        raise ConfigError(f"{where}{prefix}: a mapping of LoRA settings (enabled, dim, alpha, ...), got {value!r}")
    try:
        return LoRAConfig(**value)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = [str(part) for part in error["loc"]]
        key = loc[0] if loc else ""
        if error["type"] == "extra_forbidden":
            raise ConfigError(f"{where}{prefix}.{key}: unknown LoRA setting"
                              f"{did_you_mean(key, LoRAConfig.model_fields)}") from None
        raise ConfigError(f"{where}{prefix}.{'.'.join(loc)}={error.get('input')!r}: {error['msg']}") from None


def lora_of(params: dict[str, Any], prefix: str, provenance=None) -> LoRAConfig | None:
    """The enabled LoRA settings of a Megatron module section (None: LoRA off)."""
    if "lora" not in params:
        return None
    where = provenance.describe(f"{prefix}.lora") if provenance is not None else ""
    config = parse_lora(params["lora"], f"{prefix}.lora", where or "")
    return config if config.enabled else None


def adapted_shapes(args) -> dict[str, tuple[int, int]]:
    """(in, out) features of the smallest linear of each LoRA target in this Megatron model, whole
    (before tensor parallelism): attention's fused QKV and output projection, the MLP's fc1 (gate +
    up when gated) and fc2 over the dense and shared-expert MLPs (routed experts are not adapted)."""
    hidden, heads = args.hidden_size, args.num_attention_heads
    kv = args.kv_channels or hidden // heads
    groups = args.num_query_groups if args.group_query_attention and args.num_query_groups else heads
    shapes = {"linear_proj": ((args.v_head_dim if args.multi_latent_attention else kv) * heads, hidden)}
    if not args.multi_latent_attention:  # MLA has no fused linear_qkv
        shapes["linear_qkv"] = (hidden, (heads + 2 * groups) * kv)
    ffns = [args.moe_shared_expert_intermediate_size] if args.num_experts and args.moe_shared_expert_intermediate_size \
        else []
    if not args.num_experts or args.moe_layer_freq != 1:  # some layers keep a dense MLP
        ffns.append(args.ffn_hidden_size)
    gated = 2 if args.swiglu or args.gated_linear_unit else 1
    for ffn in filter(None, ffns):
        for name, shape in (("linear_fc1", (hidden, gated * ffn)), ("linear_fc2", (ffn, hidden))):
            if name not in shapes or min(shape) < min(shapes[name]):
                shapes[name] = shape
    return shapes


def check_rank(lora: LoRAConfig, args, prefix: str, where: str = "") -> None:
    """The rank is at most min(in, out) of every adapted linear (a larger one adds parameters and
    no expressiveness, and a rank of 10**8 would exhaust memory): one line naming the linear."""
    shapes = adapted_shapes(args)
    for target in lora.target_modules:
        if target in shapes and lora.dim > min(shapes[target]):
            fan_in, fan_out = shapes[target]
            where = f"{where}: " if where else ""
            raise ConfigError(f"{where}{prefix}.lora.dim={lora.dim}: the rank must be ≤ min(in, out) of every "
                              f"adapted linear; {target} is {fan_in} -> {fan_out}, so at most {min(fan_in, fan_out)}")


# -- the adapter ---------------------------------------------------------------------------------
def _init(method: str, rows: int, cols: int, generator) -> "Any":
    import torch

    full = torch.empty(rows, cols, dtype=torch.float32)
    if method == "zero":
        return full.zero_()
    if method == "xavier":
        return torch.nn.init.xavier_normal_(full, generator=generator)
    return torch.nn.init.kaiming_uniform_(full, a=math.sqrt(5), generator=generator)


def _weight_holder(tensor):
    import torch

    holder = torch.nn.Module()
    holder.weight = torch.nn.Parameter(tensor)
    return holder


def _lora_linear_class():
    import torch
    import torch.nn.functional as F
    from megatron.core import tensor_parallel as tp_maps
    from megatron.core.transformer.mlp import apply_swiglu_sharded_factory
    from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group, make_sharded_tensors_for_checkpoint

    class LoRALinear(torch.nn.Module):
        """A megatron-core column/row-parallel linear plus its LoRA adapter (see the module docstring)."""

        def __init__(self, base, name: str, lora: LoRAConfig, *, column: bool, swiglu: bool, seed: int,
                     tp_rank: int, tp_size: int):
            super().__init__()
            object.__setattr__(self, "base", base)  # held aside: its parameters are registered below, by name
            for pname, param in base.named_parameters(recurse=False):
                self._parameters[pname] = param  # (register_parameter would see base's through __getattr__)
            self.column, self.swiglu, self.scale = column, swiglu, lora.scale
            self.dropout, self.dropout_position = lora.dropout, lora.dropout_position
            r, full_in, full_out = lora.dim, base.input_size, base.output_size
            seed = zlib.crc32(f"{seed}:{name}".encode())
            a = _init(lora.lora_A_init_method, r, full_in, torch.Generator().manual_seed(seed))
            b = _init(lora.lora_B_init_method, full_out, r, torch.Generator().manual_seed(seed + 1))
            if column:  # B split by output rows as the base weight (SwiGLU fc1: [gate; up] per rank)
                b = self._column_shard(b, tp_rank, tp_size)
            else:  # A split by input columns
                a = a.chunk(tp_size, dim=1)[tp_rank]
            like = base.weight
            self.lora_A = _weight_holder(a.to(like.dtype).to(like.device).contiguous())
            self.lora_B = _weight_holder(b.to(like.dtype).to(like.device).contiguous())
            sharded = self.lora_B.weight if column else self.lora_A.weight
            tp_maps.set_tensor_model_parallel_attributes(sharded, True, 0 if column else 1, 1)

        def _column_shard(self, b, tp_rank: int, tp_size: int):
            if not self.swiglu:
                return b.chunk(tp_size, dim=0)[tp_rank]
            gate, up = b.chunk(2, dim=0)
            return torch.cat([gate.chunk(tp_size, dim=0)[tp_rank], up.chunk(tp_size, dim=0)[tp_rank]])

        def __getattr__(self, name: str):
            try:
                return super().__getattr__(name)
            except AttributeError:
                return getattr(self.__dict__["base"], name)  # the base's attributes (config, input_size, ...)

        def get_extra_state(self):
            return self.base.get_extra_state()

        def set_extra_state(self, state):
            self.base.set_extra_state(state)

        def _adapter(self, x, gather_output: bool):
            h = F.dropout(x, self.dropout, self.training) if self.dropout and self.dropout_position == "pre" else x
            if self.column:
                low = tp_maps.copy_to_tensor_model_parallel_region(F.linear(h, self.lora_A.weight))
                out = F.linear(low, self.lora_B.weight)
                if gather_output:
                    out = tp_maps.gather_from_tensor_model_parallel_region(out)
            else:
                if not self.base.input_is_parallel:
                    h = tp_maps.scatter_to_tensor_model_parallel_region(h)
                low = tp_maps.reduce_from_tensor_model_parallel_region(F.linear(h, self.lora_A.weight))
                out = F.linear(low, self.lora_B.weight)
            if self.dropout and self.dropout_position == "post":
                out = F.dropout(out, self.dropout, self.training)
            return out * self.scale

        def forward(self, x, *args, **kwargs):
            output, bias = self.base(x, *args, **kwargs)
            gather = False
            if self.column:
                runtime = kwargs.get("runtime_gather_output")
                gather = self.base.gather_output if runtime is None else runtime
            return output + self._adapter(x, gather), bias

        def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None):
            metadata = ensure_metadata_has_dp_cp_group(metadata)
            state = self.base.sharded_state_dict(prefix, sharded_offsets, metadata)
            adapters = {"lora_A.weight": self.lora_A.weight, "lora_B.weight": self.lora_B.weight}
            axis = {"lora_B.weight": 0} if self.column else {"lora_A.weight": 1}
            extra = make_sharded_tensors_for_checkpoint(adapters, prefix, axis, sharded_offsets,
                                                        tp_group=self.base.tp_group,
                                                        dp_cp_group=metadata["dp_cp_group"])
            if self.swiglu:  # the same [gate; up] checkpoint layout as the base weight (megatron-core's MLP)
                key = f"{prefix}lora_B.weight"
                extra[key] = apply_swiglu_sharded_factory(extra[key], sharded_offsets,
                                                          metadata.get("singleton_local_shards", False))
            state.update(extra)
            return state

    return LoRALinear


def _layer_names(chunk) -> dict[int, str]:
    """id(module) -> a name that is the same on every rank layout: the global layer number, not the local index."""
    from megatron.core.transformer.transformer_layer import TransformerLayer

    names = {}
    for _, layer in chunk.named_modules():
        if isinstance(layer, TransformerLayer):
            for sub_name, sub in layer.named_modules():
                names[id(sub)] = f"{type(layer).__name__}{layer.layer_number}.{sub_name}"
    return names


def apply_lora(chunks: list, lora: LoRAConfig, config, *, seed: int) -> dict[str, int]:
    """Freeze every parameter of the GPTModel ``chunks`` and wrap the targeted linears in place.

    Call after the base weights are loaded (HF import) and before Float16Module / DDP / the
    optimizer. Returns how many linears were wrapped per target, and ``skipped_experts``."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    LoRALinear = _lora_linear_class()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    counts = dict.fromkeys(lora.target_modules, 0) | {"skipped_experts": 0}
    for chunk in chunks:
        for param in chunk.parameters():
            param.requires_grad_(False)
        names = _layer_names(chunk)
        found = []
        for _, parent in chunk.named_modules():
            for child_name, child in parent.named_children():
                if child_name in lora.target_modules and isinstance(child, ColumnParallelLinear | RowParallelLinear):
                    found.append((parent, child_name, child))
        for parent, child_name, child in found:
            if getattr(child, "is_expert", False):
                counts["skipped_experts"] += 1
                continue
            column = isinstance(child, ColumnParallelLinear)
            if column != (child_name in _COLUMN):
                raise ConfigError(f"lora.target_modules: {child_name} is a {type(child).__name__} here")
            swiglu = child_name == "linear_fc1" and bool(config.gated_linear_unit)
            wrapped = LoRALinear(child, names.get(id(child), child_name), lora, column=column, swiglu=swiglu,
                                 seed=seed, tp_rank=tp_rank, tp_size=tp_size)
            setattr(parent, child_name, wrapped)
            counts[child_name] += 1
    return counts


def parameter_counts(chunks: list) -> tuple[int, int]:
    """(trainable, total) parameters of the whole model: TP shards counted once each, summed over PP."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    tp = parallel_state.get_tensor_model_parallel_world_size()
    counts = torch.zeros(2, dtype=torch.float64)
    for chunk in chunks:
        for param in chunk.parameters():
            n = param.numel() * (tp if getattr(param, "tensor_model_parallel", False) else 1)
            counts[1] += n
            if param.requires_grad:
                counts[0] += n
    if parallel_state.get_pipeline_model_parallel_world_size() > 1:
        group = parallel_state.get_pipeline_model_parallel_group()
        device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
        counts = counts.to(device)
        dist.all_reduce(counts, group=group)
    return int(counts[0].item()), int(counts[1].item())


def summary(lora: LoRAConfig, trainable: int, total: int) -> str:
    return (f"LoRA: {lora.describe()}; trainable {trainable} of {total} parameters "
            f"({100 * trainable / max(total, 1):.2f}%)")


# -- export --------------------------------------------------------------------------------------
def merge_lora_tensors(tensors: dict[str, Any], scale: float) -> dict[str, Any]:
    """A Megatron checkpoint's tensors (global shapes, layers stacked on the first axis) with every
    ``X.lora_A.weight`` / ``X.lora_B.weight`` pair merged into ``X.weight`` (``W + scale * B @ A``)
    and removed. B and W share the checkpoint's row layout (SwiGLU [gate; up] too), so the merge
    is exact in the global tensors whatever TP layout wrote them."""
    import torch

    merged = dict(tensors)
    for key in [k for k in tensors if k.endswith(".lora_A.weight")]:
        stem = key.removesuffix(".lora_A.weight")
        a, b = merged.pop(key), merged.pop(f"{stem}.lora_B.weight")
        weight = merged[f"{stem}.weight"]
        merged[f"{stem}.weight"] = (weight.float() + scale * torch.matmul(b.float(), a.float())).to(weight.dtype)
    return merged
