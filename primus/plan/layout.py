"""How a job is split over ranks, and the checks that a split fits the model and the world.

``ParallelLayout`` is backend-neutral: an adapter translates its engine's parallelism
settings into one (the lead's ``resolve_experiment`` path), and tests build it directly.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from primus.config.errors import ConfigError, did_you_mean
from primus.plan.model import ModelSpec

@dataclass(frozen=True)
class LayoutIssue:
    """One way a layout does not fit: ``fail`` (it cannot run) or ``warn`` (it runs, badly)."""

    level: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


LAYOUT_CHARS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}


MAX_LAYOUT_CHARS = 2**16  # an expanded layout: a layer or a stage boundary per character


def layout_bound(layers: int | None) -> int:
    """The longest expanded layout that can describe ``layers`` layers (E, L, MTP included): each
    layer char may open a stage, plus room for empty virtual stages; the global cap without a count."""
    return MAX_LAYOUT_CHARS if not layers else min(MAX_LAYOUT_CHARS, 4 * (layers + 2) + 256)


def _expand(text: str, pattern: str, limit: int, original: str) -> str:
    """``re.sub`` of one repetition pattern, the result's length checked *before* it is built."""
    size = len(text)
    for match in re.finditer(pattern, text):
        count = int(match.group(2)) if len(match.group(2)) <= 12 else limit + 1  # no 5000-digit int()
        size += len(match.group(1)) * count - len(match.group(0))
        if size > limit:
            raise ConfigError(f"pipeline layout '{original[:60]}': '{match.group(0)[:40]}' expands it to more than "
                              f"{limit} layers and stage boundaries; the model has far fewer")
    return re.sub(pattern, lambda match: match.group(1) * int(match.group(2)), text)


def parse_pipeline_layout(text: str, layers: int | None = None) -> list[str]:
    """Megatron's ``pipeline_model_parallel_layout`` string as its stages, each a string of E/t/m/L
    (megatron-core's ``PipelineParallelLayerLayout.parse_str_to_list``: commas are cosmetic,
    ``(ab|)*n`` and ``x*n`` repeat). Stage i runs on pipeline rank i % pp (virtual stage i // pp).
    The expansion is capped by the model's ``layers`` (``layout_bound``) before it is built:
    ``t*99999999999`` is one error line, not an exhausted memory."""
    flat, limit = str(text).replace(",", ""), layout_bound(layers)
    if len(flat) > limit:
        raise ConfigError(f"pipeline layout '{flat[:60]}...': {len(flat)} characters, more than {limit}")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        flat = _expand(flat, pattern, limit, str(text))
    stages = flat.split("|")
    unknown = sorted(set("".join(stages)) - set(LAYOUT_CHARS))
    if unknown:
        raise ConfigError(f"pipeline layout '{text}': unknown layer character(s) {', '.join(map(repr, unknown))} "
                          f"(known: E embedding, t decoder layer, m MTP layer, L loss)")
    return stages


def pipeline_stage_layers(text: str, pp: int) -> list[list[int]]:
    """The decoder layer ids each pipeline rank holds under a layout string, in layer order."""
    stages = parse_pipeline_layout(text)
    ranks: list[list[int]] = [[] for _ in range(pp)]
    layer = 0
    for i, stage in enumerate(stages):
        for char in stage:
            if char == "t":
                ranks[i % pp].append(layer)
                layer += 1
    return ranks


def worst_level(issues: list[LayoutIssue]) -> str:
    levels = [issue.level for issue in issues]
    return "fail" if "fail" in levels else "warn" if levels else "info"


DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
SHARDING = ("none", "optimizer", "fsdp")  # replicated, distributed optimizer (ZeRO-1), FSDP (ZeRO-3)
# Whose allocations the memory model follows (primus.plan.memory): megatron-core's local layer spec
# (CPU), its Transformer Engine spec (GPU), TorchTitan; generic = the textbook formulas.
MEMORY_MODELS = ("generic", "megatron", "megatron-te", "torchtitan")


@dataclass(frozen=True)
class ChunkPlacement:
    """What one model chunk of a pipeline rank holds: decoder layer ids, and the embedding / loss ends."""

    layers: tuple[int, ...]
    embedding: bool
    loss: bool


@dataclass(frozen=True, kw_only=True)
class ParallelLayout:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1  # expert parallel: experts split over ep ranks (inside the dp x cp x tp ranks, as Megatron)
    etp: int | None = None  # expert tensor parallel: each expert's matrices split etp ways; None = tp
    micro_batch_size: int = 1
    global_batch_size: int | None = None  # None: micro_batch_size * dp (one micro-batch per step)
    seq_len: int = 2048
    recompute: bool = False  # full activation recomputation
    sharding: str = "none"
    param_dtype: str = "bf16"
    grad_dtype: str = "fp32"
    optimizer_dtype: str = "fp32"  # Adam's two moments
    master_weights: bool = True  # an fp32 master copy when param_dtype is lower precision
    # Megatron's pipeline_model_parallel_layout ("Et*5|t*6|...|t*5,L"): layers per stage come from
    # it instead of an even n_layers / pp split
    pipeline_layout: str | None = None
    vpp: int = 1  # model chunks per pipeline rank (interleaved 1F1B)
    sequence_parallel: bool = False  # norms (and what they save) on seq_len / tp tokens
    recompute_layers: int | None = None  # with recompute: layers of each model chunk recomputed; None = all
    recompute_group: int = 1  # with recompute: consecutive layers checkpointed as one unit (one input kept)
    selective_recompute: bool = False  # Megatron: core attention; TorchTitan: op-level (every other matmul)
    dp_shard: int | None = None  # FSDP: ranks a parameter is sharded over (HSDP: fewer than dp); None = dp
    activation_dtype: str | None = None  # what the forward pass computes in; None = param_dtype
    memory_model: str = "generic"  # MEMORY_MODELS
    gpu: bool = False  # the run's kernels are the GPU's (fused norms) rather than CPU composites
    grad_bucket_size: int | None = None  # Megatron DDP: parameters per gradient bucket; None = one bucket
    loss_chunks: int = 1  # TorchTitan's chunked cross-entropy: logits of seq_len / loss_chunks at a time

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "cp", "ep", "etp", "micro_batch_size", "seq_len", "vpp", "recompute_group",
                     "dp_shard", "recompute_layers", "loss_chunks", "grad_bucket_size"):
            value = getattr(self, name)
            if value is None and name in ("etp", "dp_shard", "recompute_layers", "grad_bucket_size"):
                continue
            if name == "recompute_layers" and value == 0:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"layout {name} must be a positive integer, got {value!r}")
        gbs = self.global_batch_size
        if gbs is not None and (isinstance(gbs, bool) or not isinstance(gbs, int) or gbs < 1):
            raise ConfigError(f"layout global_batch_size must be a positive integer, got {gbs!r}")
        if self.sharding not in SHARDING:
            raise ConfigError(f"layout sharding must be one of {', '.join(SHARDING)}, got {self.sharding!r}"
                              f"{did_you_mean(self.sharding, SHARDING)}")
        if self.memory_model not in MEMORY_MODELS:
            raise ConfigError(f"layout memory_model must be one of {', '.join(MEMORY_MODELS)}, got {self.memory_model!r}"
                              f"{did_you_mean(str(self.memory_model), MEMORY_MODELS)}")
        for name in ("param_dtype", "grad_dtype", "optimizer_dtype", "activation_dtype"):
            value = getattr(self, name)
            if value is None and name == "activation_dtype":
                continue
            if value not in DTYPE_BYTES:
                raise ConfigError(f"layout {name} must be one of {', '.join(DTYPE_BYTES)}, got {value!r}"
                                  f"{did_you_mean(str(value), DTYPE_BYTES)}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ParallelLayout":
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise ConfigError(f"unknown layout key '{key}'{did_you_mean(key, known)}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def compute_dtype(self) -> str:
        """What the passes compute and FSDP gathers in (TorchTitan keeps fp32 parameters, computes in bf16)."""
        return self.activation_dtype or self.param_dtype

    def stage_layer_ids(self, n_layers: int) -> list[list[int]]:
        """The decoder layer ids on each pipeline rank: from ``pipeline_layout``, else n_layers / pp
        consecutive layers per rank (the last rank may hold fewer)."""
        if self.pipeline_layout is not None:
            return pipeline_stage_layers(self.pipeline_layout, self.pp)
        per = -(-n_layers // self.pp)
        return [list(range(r * per, min(n_layers, (r + 1) * per))) for r in range(self.pp)]

    def chunk_placement(self, n_layers: int) -> list[list[ChunkPlacement]]:
        """[pipeline rank][model chunk]: the layers each holds, and where the embedding and the loss are.
        Virtual stage i is chunk i // pp of rank i % pp (Megatron's interleaving); without a layout string,
        n_layers / (pp x vpp) consecutive layers per virtual stage, the embedding on the first, the loss
        on the last."""
        stages = self.pp * self.vpp
        if self.pipeline_layout is not None:
            texts = parse_pipeline_layout(self.pipeline_layout)
            stages, layer, spans = len(texts), 0, []
            for text in texts:
                count = text.count("t")
                spans.append((tuple(range(layer, layer + count)), "E" in text, "L" in text))
                layer += count
        else:
            per = -(-n_layers // stages)
            spans = [(tuple(range(i * per, min(n_layers, (i + 1) * per))), i == 0, i == stages - 1)
                     for i in range(stages)]
        chunks = max(1, stages // self.pp)
        return [[ChunkPlacement(*spans[c * self.pp + r]) for c in range(chunks)] for r in range(self.pp)]

    @property
    def shard_group(self) -> int:
        """Ranks a (non-expert) parameter's gradients and optimizer state are sharded over: FSDP's shard
        group, or the data-parallel ranks (with context parallelism) of the distributed optimizer."""
        return self.dp_shard * self.cp if self.dp_shard else self.dp * self.cp

    @property
    def expert_fsdp(self) -> int:
        """FSDP2's shard group for routed experts (TorchTitan's ``efsdp``: dp_shard x cp x tp / ep)."""
        return max(1, (self.dp_shard or self.dp) * self.cp * self.tp // self.ep) if self.ep > 1 else self.shard_group

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    @property
    def expert_dp(self) -> int:
        """Ranks holding the same experts (megatron-core's expert-data-parallel group): the
        tp x dp x cp ranks of a pipeline stage, divided into ep x etp. The distributed optimizer
        shards the expert parameters over these, the others over dp x cp."""
        return max(1, self.tp * self.dp * self.cp // (self.ep * self.expert_tp))

    @property
    def effective_global_batch_size(self) -> int:
        return self.global_batch_size or self.micro_batch_size * self.dp

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step on each data-parallel rank (gradient accumulation steps)."""
        return max(1, self.effective_global_batch_size // (self.micro_batch_size * self.dp))


def check_layout(model: ModelSpec, layout: ParallelLayout, world_size: int | None = None) -> list[LayoutIssue]:
    """Every way the layout does not fit the model or the world, one line each.

    ``world_size`` None skips the world check (``primus plan`` without a launch).
    """
    t, p = layout.tp, layout.pp
    found: list[LayoutIssue] = []

    def bad(message: str, **details: Any) -> None:
        found.append(LayoutIssue("fail", message, details))

    if world_size is not None and layout.world_size != world_size:
        bad(f"tp x pp x dp x cp = {t} x {p} x {layout.dp} x {layout.cp} = {layout.world_size} "
            f"does not equal the world size {world_size}", layout_world=layout.world_size, world_size=world_size)
    if model.n_heads % t:
        bad(f"n_heads ({model.n_heads}) is not divisible by tp ({t})")
    if model.n_kv_heads and model.n_kv_heads != model.n_heads and model.kv_heads % t:
        bad(f"n_kv_heads ({model.kv_heads}) is not divisible by tp ({t}): each TP rank needs whole KV heads")
    if model.ffn_dim % t:
        bad(f"ffn width ({model.ffn_dim}) is not divisible by tp ({t})")
    if layout.pipeline_layout is not None:
        try:
            stages = parse_pipeline_layout(layout.pipeline_layout)
        except ConfigError as exc:
            bad(str(exc))
        else:
            decoders = sum(stage.count("t") for stage in stages)
            if len(stages) % p:
                bad(f"the pipeline layout has {len(stages)} stages, not a multiple of pp ({p})")
            if decoders != model.n_layers:
                bad(f"the pipeline layout places {decoders} decoder layers; the model has {model.n_layers}")
    elif model.n_layers % p:
        bad(f"n_layers ({model.n_layers}) is not divisible by pp ({p})")
    gbs, mbs, dp = layout.effective_global_batch_size, layout.micro_batch_size, layout.dp
    if gbs % (mbs * dp):
        bad(f"global_batch_size ({gbs}) is not divisible by micro_batch_size x dp ({mbs} x {dp} = {mbs * dp})")
    found += _expert_issues(model, layout)
    if layout.seq_len % layout.cp:
        bad(f"seq_len ({layout.seq_len}) is not divisible by cp ({layout.cp})")
    if layout.seq_len > model.max_seq_len:
        found.append(LayoutIssue("warn", f"seq_len ({layout.seq_len}) exceeds the model's max_seq_len ({model.max_seq_len})"))
    if p > 1 and not gbs % (mbs * dp) and layout.num_microbatches < p:
        found.append(LayoutIssue("warn", f"only {layout.num_microbatches} micro-batches for {p} pipeline stages: "
                          "most of each step is pipeline bubble", {"num_microbatches": layout.num_microbatches}))
    return found


def _expert_issues(model: ModelSpec, layout: ParallelLayout) -> list[LayoutIssue]:
    """Megatron-LM's expert-parallel rules (``validate_args``, ``parallel_state.initialize_model_parallel``)."""
    ep, etp = layout.ep, layout.expert_tp
    if not model.is_moe:
        if ep > 1:
            return [LayoutIssue("fail", f"ep ({ep}) > 1 on a dense model: expert parallelism needs experts (n_experts)")]
        return []
    found = []
    if model.n_experts % ep:
        found.append(LayoutIssue("fail", f"n_experts ({model.n_experts}) is not divisible by ep ({ep})"))
    stage_ranks = layout.tp * layout.dp * layout.cp
    if stage_ranks % (ep * etp):
        found.append(LayoutIssue(
            "fail", f"ep x etp ({ep} x {etp} = {ep * etp}) does not divide the tp x dp x cp ranks of a pipeline "
                    f"stage ({layout.tp} x {layout.dp} x {layout.cp} = {stage_ranks})",
            {"ep": ep, "etp": etp, "stage_ranks": stage_ranks}))
    if model.expert_ffn_dim % etp:
        found.append(LayoutIssue("fail", f"expert width ({model.expert_ffn_dim}) is not divisible by etp ({etp})"))
    if model.shared_expert_ffn_hidden_size % layout.tp:
        found.append(LayoutIssue("fail", f"shared-expert width ({model.shared_expert_ffn_hidden_size}) is not "
                                         f"divisible by tp ({layout.tp})"))
    return found
