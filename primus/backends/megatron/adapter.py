"""The Megatron backend: megatron-core's GPTModel, DDP, optimizer, schedules and dist_checkpointing,
configured with Megatron-LM argument names."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primus.config.errors import ConfigError
from primus.data.tiny_assets import tiny_assets_dir
from primus.hf.megatron_start import (check_post_training_inputs, hf_checkpoint_spec, is_post_training,
                                     network_from_hub, post_training, strip_post_training)
from primus.plan.flops import flops_per_token
from primus.runtime.adapter import BackendAdapter, CheckpointSpec, EnginePlan, ModuleConfig

if TYPE_CHECKING:
    from primus.config.provenance import Provenance
    from primus.plan.target import Target
    from primus.runtime.admission import Refusal
    from primus.runtime.context import RunContext

TINY_PREFIX = "megatron/tiny_text_document"  # under primus.tiny_assets


def megatron_params(params: dict[str, Any], derived: list[tuple[str, Any, str]] | None = None) -> dict[str, Any]:
    """The Megatron arguments in ``params``: the ``primus:`` block is Primus' own.

    ``primus.tiny_assets: DIR`` points the tokenizer and data at the locally built tiny corpus
    (``prepare`` builds it, tokenized into ``DIR/megatron/tiny_text_document.bin/.idx``).
    """
    params = dict(params)
    extra = params.pop("primus", None) or {}
    params.pop("lora", None)  # Primus's LoRA block (primus/backends/megatron/lora.py), not a Megatron-LM argument
    # the block itself is checked against primus.config.schema.PrimusOptions before launch
    root = tiny_assets_dir({"primus": extra})
    # [#15 SFT/HF hook] hf_path / sft_* keys are Primus' (primus/hf/megatron_start.py): taken out here;
    # such a run names its files itself, so primus.tiny_assets only builds them (prepare), never overrides.
    names_its_files = is_post_training(params)
    params = strip_post_training(params, derived, tiny_root=root)
    if root is not None and not names_its_files:
        params.update(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(root / "tokenizer"),
                      data_path=[str(root / TINY_PREFIX)], mock_data=False)
        if derived is not None:
            derived += [(key, params[key], "primus.tiny_assets")
                        for key in ("tokenizer_type", "tokenizer_model", "data_path", "mock_data")]
    return params


class MegatronAdapter(BackendAdapter):
    name = "megatron"
    distribution = "megatron-core"
    import_probe = "megatron.core.models.gpt"
    extra = "megatron"
    stages = ("pretrain", "sft")
    stage_aliases = {"train": "pretrain"}
    data_commands = ("primus.backends.megatron.data_cli",)
    plans_without_engine = True  # plan() reads Megatron-LM's argument table only: `config validate --no-engine`

    def defaults(self, stage: str) -> dict[str, Any]:
        from primus.backends.megatron.arguments import default_args

        return default_args()

    def plan(self, module: ModuleConfig, world_size: int | None, provenance: "Provenance | None" = None, *,
             run_dir: Path | None = None, device: str = "cpu") -> EnginePlan:
        """Megatron-LM arguments, parsed once; the layout checked against ``world_size`` when known."""
        from primus.backends.megatron.arguments import check_parallel_layout, parse_args
        from primus.backends.megatron.plan import describe
        from primus.backends.megatron.tokenizers import plan_vocab
        from primus.config.provenance import Provenance
        from primus.config.schema import PrimusOptions, validate_model

        validate_model(PrimusOptions, module.params.get("primus") or {}, provenance or Provenance(),
                       f"modules.{module.name}.primus")
        # [#15] stage sft needs instruction data, and the post-training keys their types
        post_training(module.params, module.stage, prefix=f"modules.{module.name}", provenance=provenance)
        if is_post_training(module.params) and tiny_assets_dir(module.params) is not None:
            _build_tiny_sft_assets(module, lambda message: None)  # [#15] the files the run names exist from here on
        derived: list[tuple[str, Any, str]] = []
        args = parse_args(megatron_params(module.params, derived), module=module.name, provenance=provenance)
        lora = _check_lora(module, args, provenance)
        if args.bf16 and not device.startswith("cuda"):  # perf (#17): bf16 only where the CPU has bf16 units
            from primus.plan.devices import cpu_bf16_decision

            keep, reason = cpu_bf16_decision()
            if not keep:
                args.bf16 = False
                derived.append(("bf16", False, reason))
        if world_size is not None:
            check_parallel_layout(args, world_size, module=module.name)
        vocab, vocab_source = plan_vocab(args)  # a plan never needs the tokenizer's files: they may be elsewhere
        model, layout = describe(args, module.params.get("model"), world_size, device, vocab_size=vocab)
        if not args.vocab_size:
            derived.append(("vocab_size", vocab or "unknown", f"{vocab_source}; the run reads the tokenizer"
                            if vocab else f"{vocab_source}: the plan counts no embedding or output layer"))
        if network_from_hub(module.params):  # provisional shapes only: no model to estimate until the run starts
            model = None
        save = Path(args.save) if args.save else (run_dir or Path(".")) / "checkpoints"
        checkpoint = hf_checkpoint_spec(module.params, save) or CheckpointSpec(save, load=args.load)  # [#15]
        plan = EnginePlan(module, world_size, args, checkpoint, model, layout,
                          flops_per_token=flops_per_token(model, args.seq_length) if model else None)
        for key, value, reason in derived:
            plan.derive(key, value, reason)
        if lora is not None:
            base = "" if module.params.get("hf_path") else " (no hf_path: the frozen base is megatron-core's random init)"
            plan.derive("lora", lora.describe(), f"adapters y = W x + {lora.scale:g} * B A x on megatron-core's linears "
                        f"(alpha / dim); every base weight frozen{base}")
        return plan

    def admit(self, plan: EnginePlan, target: "Target") -> "list[Refusal]":
        from primus.backends.megatron.admission import admit

        return admit(plan, target) + _lora_on_te_layers(plan.module, plan.engine_config)

    def prepare(self, plan: EnginePlan, log: Callable[[str], None]) -> None:
        root = tiny_assets_dir(plan.module.params)
        if root is not None and is_post_training(plan.module.params):  # [#15 SFT/HF hook]
            _build_tiny_sft_assets(plan.module, log)
            return
        if root is None or (root / f"{TINY_PREFIX}.idx").exists():
            return
        from primus.data.indexed import build_indexed_dataset
        from primus.data.tiny_assets import ensure_tiny_assets

        log(f"building the tiny tokenizer, corpus and Megatron .bin/.idx in {root} (primus.tiny_assets)")
        assets = ensure_tiny_assets(root)
        build_indexed_dataset(assets["corpus_file"], assets["tokenizer"], root / TINY_PREFIX)

    def derived_params(self, params: dict[str, Any], stage: str = "pretrain") -> list[tuple[str, Any, str]]:
        """What ``primus.tiny_assets`` sets; resolution records it, so ``config show --why`` tells (ux, #18)."""
        if is_post_training(params):  # names its own files; the HF config.json is read at plan time (derived lines)
            return []
        derived: list[tuple[str, Any, str]] = []
        megatron_params(params, derived)
        return derived

    def check_inputs(self, plan: EnginePlan, provenance: "Provenance | None" = None) -> None:
        if is_post_training(plan.module.params):  # [#15 SFT/HF hook] HF tensors vs the model, instruction files
            check_post_training_inputs(plan, provenance=provenance)
        from primus.compat.hub import is_hub_id

        if tiny_assets_dir(plan.module.params) is not None:
            return  # built by prepare() before the ranks start
        from primus.backends.megatron.data import DATA_KEYS, data_prefixes
        from primus.backends.megatron.validate_args import require_data_source

        from primus.backends.megatron.tokenizers import files_of

        args, prefix = plan.engine_config, f"modules.{plan.module.name}"
        require_data_source(args, plan.module.name)  # a launch reads data; a plan needs none
        # a Hub id (a HuggingFaceTokenizer's tokenizer_model) is fetched when the run starts
        checks = [(key, Path(path)) for key, path in files_of(args) if not is_hub_id(path)]
        if args.pretrained_checkpoint:
            checks.append(("pretrained_checkpoint", Path(args.pretrained_checkpoint)))
        # data_path and train/valid/test_data_path
        checks += [(key, Path(f"{p}.idx"))
                   for key, p in data_prefixes({key: getattr(args, key) for key in (*DATA_KEYS, "mock_data")})]
        if args.load:
            checks.append(("load", Path(args.load)))
        for key, path in checks:
            if not path.exists():
                full = f"{prefix}.{key}"
                where = f"{provenance.describe(full)}: " if provenance is not None else ""
                raise ConfigError(f"{where}{full}: {path} does not exist")

    def resume_problem(self, plan: EnginePlan, resuming: bool) -> str | None:
        """torch_dist reshards; the legacy format and the distributed optimizer's default state do not
        (``reshard.py``). The source is ``load`` when given (Megatron-LM's rule), else the run's own."""
        from primus.backends.megatron.reshard import problem_for_run

        args = plan.engine_config
        root = Path(args.load) if args.load else (plan.checkpoint.directory if resuming else None)
        return problem_for_run(args, plan.world_size, root) if root is not None else None

    def run(self, plan: EnginePlan, ctx: "RunContext") -> None:
        self.require_installed()
        plan.log_derived(ctx)
        if not ctx.device.startswith("cuda"):
            from primus.backends.megatron.cpu_patches import apply_cpu_patches

            applied = apply_cpu_patches()
            if applied:
                ctx.log_derived("megatron_cpu_patches", ",".join(applied), "no CUDA: megatron-core needs CPU shims")
        from primus.backends.megatron.trainer import train

        from primus.backends.megatron.lora import lora_of

        prefix = f"modules.{plan.module.name}"
        post = post_training(plan.module.params, plan.module.stage, prefix=prefix)
        lora = lora_of(plan.module.params, prefix)
        train(plan.engine_config, ctx, plan.module.name, post, lora)  # [#15 SFT/HF hook] post: HF weights / instructions


def _check_lora(module: ModuleConfig, args, provenance):
    """The ``lora`` block's keys, and what LoRA needs: no sequence parallelism. Any stage, with or without
    ``hf_path`` (AMD's 4-layer LoRA benchmarks adapt a randomly initialised base: the plan says so)."""
    from primus.backends.megatron.lora import check_rank, lora_of

    prefix = f"modules.{module.name}"
    lora = lora_of(module.params, prefix, provenance)
    if lora is None:
        return
    where = f"{provenance.describe(prefix + '.lora')}: " if provenance is not None else ""
    if args.sequence_parallel:
        raise ConfigError(f"{where}{prefix}.lora: LoRA with sequence_parallel is not supported yet "
                          "(set sequence_parallel: false)")
    check_rank(lora, args, prefix, where.removesuffix(": "))
    return lora


def _lora_on_te_layers(module: ModuleConfig, args) -> "list[Refusal]":
    """LoRA wraps megatron-core's local linears; FP8 and context parallelism need Transformer Engine's layers."""
    from primus.backends.megatron.lora import lora_of
    from primus.backends.megatron.te_features import uses_context_parallel, uses_fp8
    from primus.runtime.admission import Refusal

    if (uses_fp8(args) or uses_context_parallel(args)) and lora_of(module.params, f"modules.{module.name}"):
        return [Refusal("lora", "lora", "LoRA wraps megatron-core's local linears, and FP8 / context parallelism "
                                        "need Transformer Engine's layers: drop one")]
    return []


def _build_tiny_sft_assets(module: ModuleConfig, log: Callable[[str], None]) -> None:
    from primus.hf.tiny import ensure_tiny_sft_assets

    root = tiny_assets_dir(module.params)
    log(f"tiny Hugging Face model and instruction set in {root} (primus.tiny_assets)")
    ensure_tiny_sft_assets(root)
