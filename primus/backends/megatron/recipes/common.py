"""What every Megatron recipe shares: Megatron-LM arguments parsed once into a ``MegatronPlan``, the
tiny assets and Hub copies prepared, megatron-core's loop run, a ``torch_dist`` checkpoint exported.

A recipe differs only in what it reads besides (``instructions``: the sft recipe reads instruction
data, the pretrain recipe refuses it) and, for LoRA, in the adapters it adds to the plan.
"""
from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primus.backends.megatron.checkpoint import ITERATION
from primus.backends.megatron.params import TINY_PREFIX, megatron_params
from primus.backends.megatron.post_training import (MegatronPostTraining, MegatronPostTrainingKeys,
                                                    check_post_training_inputs, is_post_training, network_from_hub,
                                                    post_training, read_keys)
from primus.config.errors import ConfigError
from primus.config.provenance import error_at
from primus.data.sft import SFTDataSpec
from primus.data.tiny_assets import built_by_prepare, tiny_assets_dir
from primus.plan.flops import flops_per_token
from primus.plan.sizing import LLM
from primus.runtime.adapter import CheckpointSpec, Derived, EnginePlan, HFWeights, ModuleConfig, Recipe

if TYPE_CHECKING:
    from primus.backends.megatron.arguments import MegatronArgs
    from primus.backends.megatron.lora import LoRAConfig
    from primus.config.provenance import Provenance
    from primus.plan.layout import ParallelLayout
    from primus.plan.target import Target
    from primus.runtime.admission import Refusal
    from primus.plan.model import ModelSpec
    from primus.runtime.context import RunContext



@dataclass
class MegatronPlan(EnginePlan["MegatronArgs", "ModelSpec", "ParallelLayout"]):
    """The Megatron arguments plus what Primus adds around megatron-core's loop."""

    post: MegatronPostTraining | None = None  # HF weights to start from, instruction data
    lora: "LoRAConfig | None" = None  # the adapters of the lora recipe


class MegatronRecipe(Recipe):
    """A Megatron run: megatron-core's GPTModel, DDP, optimizer, schedules and dist_checkpointing."""

    def defaults(self) -> dict[str, Any]:
        from primus.backends.megatron.arguments import default_args

        return default_args()

    def derived_params(self, params: dict[str, Any]) -> list[tuple[str, Any, str]]:
        """What ``primus.tiny_assets`` sets; resolution records it, so ``config show --why`` tells.
        A run from HF weights / on instructions names its own files (the HF config.json is read at plan time)."""
        if is_post_training(params):
            return []
        derived: list[tuple[str, Any, str]] = []
        megatron_params(params, derived)
        return derived

    @abstractmethod
    def instructions(self, keys: MegatronPostTrainingKeys, module: ModuleConfig,
                     provenance: "Provenance | None") -> SFTDataSpec | None:
        """The instruction data this recipe reads (None: none); a key it does not read is an error."""

    def plan(self, module: ModuleConfig, world_size: int | None, provenance: "Provenance | None" = None, *,
             run_dir: Path | None = None, device: str = "cpu") -> MegatronPlan:
        """Megatron-LM arguments, parsed once; the layout checked against ``world_size`` when known."""
        from primus.backends.megatron.arguments import check_parallel_layout, parse_args
        from primus.backends.megatron.plan import describe
        from primus.backends.megatron.tokenizers import plan_vocab

        keys = read_keys(module.params, module.prefix, provenance)
        instructions = self.instructions(keys, module, provenance)
        derived: list[tuple[str, Any, str]] = []
        args = parse_args(megatron_params(module.params, derived, prefix=module.prefix, provenance=provenance),
                          module=module.name, provenance=provenance)
        post = post_training(module.params, keys, instructions, prefix=module.prefix)
        if args.bf16 and not device.startswith("cuda"):  # bf16 only where the CPU has bf16 units
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
        if network_from_hub(module.params):  # provisional shapes only: no model to estimate before prepare fetches it
            model = None
        save = Path(args.save) if args.save else (run_dir or Path(".")) / "checkpoints"
        checkpoint = CheckpointSpec(save, load=args.load, step_pattern=ITERATION)
        if keys.hf_path:
            checkpoint = CheckpointSpec(save, load=str(Path(keys.hf_path).expanduser().absolute()), format="hf",
                                        step_pattern=ITERATION)
        plan = MegatronPlan(module, self, world_size, args, checkpoint, model, layout, sizing=LLM,
                            flops_per_token=flops_per_token(model, args.seq_length) if model else None, post=post)
        for key, value, reason in derived:
            plan.derive(key, value, reason)
        return plan

    def check_inputs(self, plan: MegatronPlan, provenance: "Provenance | None" = None) -> None:
        check_post_training_inputs(plan, provenance=provenance)  # HF tensors vs the model, instruction files
        from primus.backends.megatron.data import DATA_KEYS, data_prefixes
        from primus.backends.megatron.tokenizers import files_of
        from primus.backends.megatron.validate_args import require_data_source
        from primus.compat.hub import is_hub_id

        args, prefix = plan.engine_config, plan.module.prefix
        require_data_source(args, plan.module.name)  # a launch reads data; a plan needs none
        # a Hub id (a HuggingFaceTokenizer's tokenizer_model) is fetched by prepare
        checks = [(key, Path(path)) for key, path in files_of(args) if not is_hub_id(path)]
        if args.pretrained_checkpoint:
            checks.append(("pretrained_checkpoint", Path(args.pretrained_checkpoint)))
        # data_path and train/valid/test_data_path
        checks += [(key, Path(f"{p}.idx"))
                   for key, p in data_prefixes({key: getattr(args, key) for key in (*DATA_KEYS, "mock_data")})]
        if args.load:
            checks.append(("load", Path(args.load)))
        for key, path in checks:
            if not path.exists() and not built_by_prepare(path, plan.module.params):
                raise error_at(provenance, f"{prefix}.{key}", f"{path} does not exist")

    def admit(self, plan: MegatronPlan, target: "Target") -> "list[Refusal]":
        """The Megatron-LM arguments this backend cannot honour on ``target`` (``admission.py``)."""
        from primus.backends.megatron.admission import admit

        return admit(plan, target)

    def resume_problem(self, plan: MegatronPlan, resuming: bool) -> str | None:
        """torch_dist reshards; the legacy format and the distributed optimizer's default state do not
        (``reshard.py``). The source is ``load`` when given (Megatron-LM's rule), else the run's own."""
        from primus.backends.megatron.reshard import problem_for_run

        args = plan.engine_config
        root = Path(args.load) if args.load else (plan.checkpoint.directory if resuming else None)
        return problem_for_run(args, plan.world_size, root) if root is not None else None

    def prepare(self, plan: MegatronPlan, log: Callable[[str], None]) -> list[Derived]:
        root = tiny_assets_dir(plan.module.params)
        if root is None:
            from primus.backends.megatron.hub import localize_hub_references

            return localize_hub_references(plan.module.params)
        if is_post_training(plan.module.params):  # the tiny HF model and instruction set the run names
            from primus.hf.tiny import ensure_tiny_sft_assets

            log(f"tiny Hugging Face model and instruction set in {root} (primus.tiny_assets)")
            ensure_tiny_sft_assets(root)
        elif not (root / f"{TINY_PREFIX}.idx").exists():
            from primus.data.indexed import build_indexed_dataset
            from primus.data.tiny_assets import ensure_tiny_assets

            log(f"building the tiny tokenizer, corpus and Megatron .bin/.idx in {root} (primus.tiny_assets)")
            assets = ensure_tiny_assets(root)
            build_indexed_dataset(assets["corpus_file"], assets["tokenizer"], root / TINY_PREFIX)
        return []

    def run(self, plan: MegatronPlan, ctx: "RunContext") -> None:
        from primus.backends.megatron.patches import ENGINE, PATCHES, params_uses
        from primus.runtime.patches import Patcher, Where

        self.adapter.require_installed()
        plan.log_derived(ctx)
        where = Where(ctx.device.startswith("cuda"), ctx.device, params_uses(plan.module.params))
        with Patcher(PATCHES, where) as patcher:
            patcher.log(ctx.logger, ENGINE)
            from primus.backends.megatron.trainer import train

            train(plan.engine_config, ctx, plan.module.name, plan.post, plan.lora)

    def export(self, plan: MegatronPlan, step: int | None, warn: Callable[[str], None] | None = None) -> HFWeights:
        """torch_dist tensors have the layout-free keys and global shapes of ``hf_adapter``; LoRA merged.
        The step read is verified whole (else the newest whole one, said)."""
        from primus.backends.checkpoint_io import read_dcp_tensors
        from primus.backends.megatron.hf_adapter import megatron_to_hf
        from primus.backends.megatron.legacy_checkpoint import is_legacy
        from primus.runtime.checkpoints import pick_checkpoint

        step, path = pick_checkpoint(plan.checkpoint.directory, ITERATION, step, warn=warn)
        if is_legacy(path):
            raise ConfigError(f"{path}: Megatron-LM's legacy layout (ckpt_format: torch); export reads torch_dist "
                              "checkpoints (resume the run for a step with ckpt_format: torch_dist)")
        source, spec = None, plan.model
        if plan.checkpoint.format == "hf":  # the HF model it started from: its config and unpadded vocabulary
            from primus.hf.config import model_spec_from_hf, read_config

            source = Path(plan.checkpoint.load)
            spec = model_spec_from_hf(read_config(source))
        tensors = read_dcp_tensors(path, lambda key: not key.startswith(("optimizer", "rng_state")))
        if plan.lora is not None:  # W + (alpha / dim) * B @ A, as AutoModel's PEFT adapters are merged
            from primus.backends.megatron.lora import merge_lora_tensors

            tensors = merge_lora_tensors(tensors, plan.lora.scale)
        return HFWeights(megatron_to_hf(tensors, spec), spec, source, plan.engine_config.tokenizer_model, path, step)
