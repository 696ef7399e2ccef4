"""NeMo AutoModel's LLM fine-tuning (``stage: sft``): ``TrainFinetuneRecipeForNextTokenPrediction``.

The module section is AutoModel's LLM YAML (``model``, ``peft``, ``step_scheduler``, ``optimizer``,
``lr_scheduler``, ``distributed``, ``checkpoint``, ``dataset`` ...). Primus takes out its own keys and
derives what it owns (checkpoint dir under the run dir, process-group backend, the model's HF folder
from ``primus.tiny_assets``); a ``dataset`` without ``_target_`` is Primus's instruction data
(``primus.backends.nemo_automodel.sft_data.SFTDatasetConfig``: same rendering and response-only labels
as the other backends) and its held-out split becomes ``validation_dataset``. Every section is checked
by AutoModel's own typed configs (``RecipeConfig``) before launch. LoRA is AutoModel's (``peft:``; the
lora recipe wraps this one); ``primus export`` writes the consolidated weights.

With ``primus.sample_hashes`` each step's token ids are digested before the step runs (``record_tokens``).
Each optimizer step is reported through ``RunContext.report_step`` (the recipe's own
``_run_train_optim_step`` returns the step's global loss, grad norm and LR); each validation
loss goes through ``RunContext.report_eval`` (metrics.jsonl, ``[EVAL]``, TensorBoard, trackers).
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primus.config.errors import ConfigError, did_you_mean
from primus.config.provenance import error_at, located
from primus.data.tiny_assets import built_by_prepare, tiny_assets_dir
from primus.runtime.adapter import CheckpointSpec, EnginePlan, HFWeights, ModuleConfig, Recipe

if TYPE_CHECKING:
    from primus.config.provenance import Provenance
    from primus.plan.layout import ParallelLayout
    from primus.plan.model import ModelSpec
    from primus.runtime.context import RunContext

RECIPE = "TrainFinetuneRecipeForNextTokenPrediction"
SFT_DATASET = "primus.backends.nemo_automodel.sft_data.SFTDatasetConfig"
SAVED_STEP = r"epoch_\d+_step_(\d+)"  # AutoModel's name of a saved step: the state after step S + 1
LLMPlan = EnginePlan[dict, "ModelSpec", "ParallelLayout"]  # engine_config: AutoModel's config as a dict
MODEL_TARGET = "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained"
# What TrainFinetuneRecipeForNextTokenPrediction (0.7.0) reads: recipes/llm/train_ft.py,
# recipes/_typed_config.py (RecipeConfig), recipes/_dist_utils.py. A test re-reads the source for drift.
TOP_LEVEL = frozenset({
    "recipe", "seed", "dist_env", "model", "peft", "distributed", "step_scheduler", "loss_fn", "dataset",
    "dataloader", "validation_dataset", "validation_dataloader", "packed_sequence", "optimizer", "lr_scheduler",
    "checkpoint", "clip_grad_norm", "wandb", "mlflow", "comet", "fp8", "compile", "quantization", "qat",
    "freeze_config", "sdpa_method", "domain_mixture", "prewarm", "embedding_row_repair", "mfu", "neftune",
    "moe_metrics", "nvtx", "tool_call_eval", "mtp",
})
PRIMUS_KEYS = frozenset({"primus"})


def _defaults() -> dict[str, Any]:
    """The lowest layer of an AutoModel ``stage: sft`` section."""
    loader = {"_target_": "torchdata.stateful_dataloader.StatefulDataLoader",
              "collate_fn": "nemo_automodel.components.datasets.utils.default_collater"}
    return {
        "recipe": RECIPE,
        "seed": 42,
        "model": {"_target_": MODEL_TARGET},
        "loss_fn": {"_target_": "nemo_automodel.components.loss.masked_ce.MaskedCrossEntropy"},
        "dataloader": {**loader, "shuffle": True},
        "validation_dataloader": dict(loader),
        "distributed": {"strategy": "fsdp2", "dp_size": None, "tp_size": 1, "cp_size": 1},
        "checkpoint": {"enabled": True, "model_save_format": "safetensors", "save_consolidated": False},
    }


def build_handoff(params: dict[str, Any], *, checkpoint_dir: Path, dist_backend: str, plan: "EnginePlan",
                  prefix: str) -> dict[str, Any]:
    """The plain dict AutoModel's ``ConfigNode`` wraps, with what Primus owns derived (and said)."""
    cfg = copy.deepcopy({k: v for k, v in params.items() if k not in PRIMUS_KEYS})
    if cfg.get("recipe") != RECIPE:  # first: a diffusion recipe's keys are not the LLM recipe's typos
        raise ConfigError(f"{prefix}.recipe: stage sft runs {RECIPE} (got {cfg.get('recipe')!r}); "
                          "TrainDiffusionRecipe supports stages pretrain, finetune", key="recipe")
    unknown = [ConfigError(f"{prefix}.{key}: not read by AutoModel's {RECIPE}{did_you_mean(key, TOP_LEVEL)}", key=key)
               for key in cfg if key not in TOP_LEVEL and not key.startswith("validation_dataset")]
    if unknown:
        raise ConfigError.of_all(unknown)
    model = cfg.setdefault("model", {})
    tiny = (params.get("primus") or {}).get("tiny_assets")
    if tiny and not model.get("pretrained_model_name_or_path"):
        model["pretrained_model_name_or_path"] = str(Path(tiny).expanduser().absolute() / "hf" / "llama_tiny")
        plan.derive("model.pretrained_model_name_or_path", model["pretrained_model_name_or_path"], "primus.tiny_assets")
    if not model.get("pretrained_model_name_or_path"):
        raise ConfigError(f"{prefix}.model.pretrained_model_name_or_path is required (a Hugging Face model folder "
                          "or hub id)", key="model.pretrained_model_name_or_path")
    source = model["pretrained_model_name_or_path"]
    if Path(source).expanduser().exists() or str(source).startswith((".", "/", "~")):
        model["pretrained_model_name_or_path"] = source = str(Path(source).expanduser().absolute())
    _instruction_dataset(cfg, source, plan)
    checkpoint = cfg.setdefault("checkpoint", {})
    if checkpoint.get("checkpoint_dir") not in (None, str(checkpoint_dir)):
        plan.derive("checkpoint.checkpoint_dir", str(checkpoint_dir), "Primus keeps checkpoints in the run dir")
    checkpoint["checkpoint_dir"] = str(checkpoint_dir)
    dist_env = cfg.setdefault("dist_env", {})
    if "backend" not in dist_env:
        dist_env["backend"] = plan.derive("dist_env.backend", dist_backend, "from the device")
    return cfg


def _instruction_dataset(cfg: dict[str, Any], model_dir: str, plan: "EnginePlan") -> None:
    """A ``dataset`` without ``_target_`` is Primus's instruction data; its held-out split validates."""
    dataset = cfg.get("dataset")
    if not isinstance(dataset, dict) or "_target_" in dataset:
        return
    dataset = cfg["dataset"] = {"_target_": SFT_DATASET, "tokenizer_path": model_dir, **dataset}
    plan.derive("dataset._target_", SFT_DATASET, "Primus instruction data (primus.data.sft)")
    if "validation_dataset" not in cfg and dataset.get("valid_fraction", 0.05) > 0 or dataset.get("valid_path"):
        cfg.setdefault("validation_dataset", {**dataset, "split": "valid"})
        plan.derive("validation_dataset", "the held-out instruction split", "stage sft")


def check_with_recipe_config(cfg: dict[str, Any], prefix: str) -> None:
    """Build AutoModel's own typed section configs (no model, no data): unknown fields fail here."""
    from nemo_automodel.components.config.loader import ConfigNode
    from nemo_automodel.recipes._typed_config import RecipeConfig

    typed = RecipeConfig(ConfigNode(copy.deepcopy(cfg)))
    errors = []
    for section in ("step_scheduler", "lr_scheduler", "optimizer", "loss_fn", "checkpoint", "dataloader",
                    "validation_dataloaders"):
        try:
            getattr(typed, section)
        except (TypeError, ValueError) as exc:
            errors.append(ConfigError(f"{prefix}.{section}: {exc}", key=section))
    if errors:
        raise ConfigError.of_all(errors)


def model_spec(cfg: dict[str, Any], tiny_root: Path | None):
    """The neutral model of the HF folder (None for a hub id: no local config.json to read); the tiny
    model ``primus.tiny_assets`` will build is read as what it will be (a plan builds nothing)."""
    from primus.hf.config import model_spec_from_hf
    from primus.hf.tiny import hf_config

    folder = Path(cfg["model"]["pretrained_model_name_or_path"]).expanduser().absolute()
    try:
        return model_spec_from_hf(hf_config(folder, tiny_root), f"{folder}/config.json")
    except ConfigError:
        return None  # a Hub id, or an architecture Primus does not map: AutoModel may still train it


def layout(cfg: dict[str, Any], world_size: int | None, seq_len: int):
    """AutoModel's FSDP2 layout: TP x CP inside, the rest data parallel (fully sharded)."""
    from primus.plan.layout import ParallelLayout

    dist, steps = cfg.get("distributed") or {}, cfg.get("step_scheduler") or {}
    tp, cp = int(dist.get("tp_size") or 1), int(dist.get("cp_size") or 1)
    world = world_size or tp * cp
    policy = dist.get("mp_policy") or {}
    param_dtype = "fp32" if str(policy.get("param_dtype", "bfloat16")).endswith("float32") else "bf16"
    return ParallelLayout(tp=tp, cp=cp, dp=max(1, world // (tp * cp)), micro_batch_size=int(steps.get("local_batch_size", 1)),
                          global_batch_size=steps.get("global_batch_size"), seq_len=seq_len, sharding="fsdp",
                          param_dtype=param_dtype, master_weights=param_dtype != "fp32")


class AutoModelSFT(Recipe):
    """A Hugging Face LLM fine-tuned by AutoModel's LLM recipe (full weights; LoRA: ``lora.py``)."""

    patch_uses = frozenset({"llm"})

    stage = "sft"

    def defaults(self) -> dict[str, Any]:
        return _defaults()

    def plan(self, module: ModuleConfig, world_size: int | None, provenance: "Provenance | None" = None, *,
             run_dir: Path | None = None, device: str = "cpu") -> LLMPlan:
        """AutoModel's own config (the hand-off dict), every section checked by its typed configs."""
        from primus.plan.flops import flops_per_token
        from primus.plan.sizing import LLM

        self.adapter.require_installed()
        prefix = module.prefix
        checkpoint_dir = (run_dir or Path(".")) / "checkpoints"
        plan: LLMPlan = EnginePlan(module, self, world_size, {}, CheckpointSpec(checkpoint_dir), sizing=LLM)

        try:
            cfg = build_handoff(module.params, checkpoint_dir=checkpoint_dir, plan=plan, prefix=prefix,
                                dist_backend="nccl" if device.startswith("cuda") else "gloo")
            check_with_recipe_config(cfg, prefix)
        except ConfigError as exc:
            raise located(exc, provenance, prefix) from None
        plan.engine_config = cfg
        plan.checkpoint = CheckpointSpec(checkpoint_dir, load=cfg["model"]["pretrained_model_name_or_path"],
                                         format="hf", step_pattern=SAVED_STEP)
        plan.model = model_spec(cfg, tiny_assets_dir(module.params))
        seq = (cfg.get("dataset") or {}).get("seq_length")
        plan.layout = layout(cfg, world_size, seq or 2048)
        if plan.model is not None and seq:
            plan.flops_per_token = flops_per_token(plan.model, seq)
        return plan

    def check_inputs(self, plan: LLMPlan, provenance: "Provenance | None" = None) -> None:
        """The model folder and instruction files exist; a local HF checkpoint matches its own config."""
        cfg, prefix, params = plan.engine_config, plan.module.prefix, plan.module.params

        def fail(key: str, message: str) -> ConfigError:
            return error_at(provenance, f"{prefix}.{key}", message)

        source = cfg["model"]["pretrained_model_name_or_path"]
        if built_by_prepare(source, params):
            return  # the tiny model and instruction set, built by prepare() before the ranks start
        if source.startswith("/") and not Path(source).exists():
            raise fail("model.pretrained_model_name_or_path", f"{source} does not exist")
        for section in [k for k in cfg if k == "dataset" or k.startswith("validation_dataset")]:
            node = cfg[section] or {}
            if node.get("_target_") == SFT_DATASET:
                for key in ("path", "valid_path"):
                    if node.get(key) and not Path(node[key]).expanduser().exists() and \
                            not built_by_prepare(node[key], params):
                        raise fail(f"{section}.{key}", f"{node[key]} does not exist")
        if plan.model is not None:
            from primus.hf.checkpoint import HFCheckpoint, check_against_spec

            check_against_spec(HFCheckpoint(source), plan.model, f"{prefix}.model.pretrained_model_name_or_path")

    def resume_problem(self, plan: LLMPlan, resuming: bool) -> str | None:
        """The model and optimizer reshard; the per-rank dataloader states do not (``resume.py``)."""
        from primus.backends.nemo_automodel.resume import data_position_problem

        return data_position_problem(plan.engine_config, "distributed", plan.world_size, resuming)

    def prepare(self, plan: LLMPlan, log: Callable[[str], None]) -> list:
        root = tiny_assets_dir(plan.module.params)
        if root is not None:
            from primus.hf.tiny import ensure_tiny_sft_assets

            log(f"tiny Hugging Face model and instruction set in {root} (primus.tiny_assets)")
            ensure_tiny_sft_assets(root)
        return []

    def run(self, plan: LLMPlan, ctx: "RunContext") -> None:
        from nemo_automodel.components.config.loader import ConfigNode
        from nemo_automodel.recipes.llm.train_ft import TrainFinetuneRecipeForNextTokenPrediction

        from primus.backends.nemo_automodel.patches import ENGINE, PATCHES, check_version
        from primus.runtime.patches import Patcher, Where

        check_version(self.adapter.require_installed(), ctx.logger.warning)
        with Patcher(PATCHES, Where.here(self.patch_uses)) as patcher:  # undone when the run ends
            patcher.log(ctx.logger, ENGINE)
            self._train(TrainFinetuneRecipeForNextTokenPrediction, ConfigNode, plan, ctx)

    def _train(self, recipe_class: type, config_node: type, plan: LLMPlan, ctx: "RunContext") -> None:
        from primus.backends.nemo_automodel.recipes.diffusion import check_fresh_checkpoint_dir
        from primus.runtime.preemption import Preempted

        plan.log_derived(ctx)
        cfg = plan.engine_config
        check_fresh_checkpoint_dir(cfg, ctx)
        if ctx.resume and not cfg["checkpoint"].get("restore_from"):
            cfg["checkpoint"]["restore_from"] = "LATEST"
        peft = "LoRA (peft)" if cfg.get("peft") else "full fine-tuning"
        ctx.logger.info("nemo_automodel sft: %s of the Hugging Face checkpoint %s", peft,
                        cfg["model"]["pretrained_model_name_or_path"])
        recipe = recipe_class(config_node(cfg))
        recipe.setup()  # the patches keep Primus's logging and, on CPU, send CUDA calls to the CPU
        tap = LLMStepTap(recipe, ctx, plan.flops_per_token)
        try:
            recipe.run_train_validation_loop()
        finally:
            tap.close()
        if getattr(recipe.step_scheduler, "sigterm_flag", False):
            raise Preempted(int(recipe.step_scheduler.step), checkpointed=True)
        ctx.logger.info("nemo_automodel sft: %d optimizer steps, checkpoints in %s", tap.steps,
                        cfg["checkpoint"]["checkpoint_dir"])

    def export(self, plan: LLMPlan, step: int | None, warn: Callable[[str], None] | None = None) -> HFWeights:
        """The consolidated weights of a saved step (``checkpoint.save_consolidated: true``)."""
        from safetensors.torch import load_file

        source, step, path = saved_model(plan, step)
        folder = path / "consolidated" if (path / "consolidated").is_dir() else path
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise ConfigError(f"{path}: no safetensors weights (set checkpoint.save_consolidated: true)")
        tensors: dict[str, Any] = {}
        for file in files:
            tensors.update(load_file(str(file)))
        return HFWeights(tensors, base_model(source), source, str(source), path, step)


def saved_model(plan: LLMPlan, step: int | None) -> tuple[Path, int, Path]:
    """(the base model's folder, the step, its saved ``model`` folder) of a run, for export."""
    from primus.backends.checkpoint_io import pick_step, saved_steps

    source = Path(plan.engine_config["model"]["pretrained_model_name_or_path"])
    if not source.is_dir():
        raise ConfigError(f"{plan.checkpoint.directory.parent}: export needs the run's base model as a local "
                          f"folder (got {source})")
    root = plan.checkpoint.directory
    step, path = pick_step(saved_steps(root, SAVED_STEP, complete="model", offset=1), step, root)
    return source, step, path / "model"


def base_model(source: Path):
    from primus.hf.config import model_spec_from_hf, read_config

    return model_spec_from_hf(read_config(source))


def record_tokens(samples: Any, batches: list, dp_rank: int, dp_size: int) -> None:
    """Each micro-batch's token ids, one sample a row without its padding (``default_collater`` pads to
    the micro-batch's longest), into ``primus.sample_hashes``' digest. AutoModel's
    ``StatefulDistributedSampler`` deals one shuffled order round-robin (rank r takes places r, r + dp,
    ...), so a row is keyed by its place in the step's dealt order."""
    for batch in batches:
        ids, mask = batch["input_ids"], batch.get("attention_mask")
        rows = [row[keep.bool()] for row, keep in zip(ids, mask)] if mask is not None and mask.shape == ids.shape \
            else ids
        samples.add(rows, group_rank=dp_rank, dealt_over=dp_size)


class LLMStepTap:
    """Report every optimizer step of the LLM recipe, and its validation losses, to Primus."""

    def __init__(self, recipe: Any, ctx: "RunContext", flops_per_token: float | None):
        self.recipe, self.ctx, self.flops_per_token = recipe, ctx, flops_per_token
        self.steps = 0
        original_step, original_val = recipe._run_train_optim_step, recipe.log_val_metrics

        from primus.backends.nemo_automodel.hooks import time_saves_and_validation

        computing, clock = ctx.phase("compute"), ctx.instruments.clock

        def run_train_optim_step(batches, max_grad_norm=None):
            if ctx.samples is not None:  # before the recipe moves or reshapes the batches
                record_tokens(ctx.samples, batches, recipe._get_dp_rank(), recipe._get_dp_group_size())
            start = time.perf_counter()
            with computing:  # the optimizer's hooks carve its own phase out of it
                sample = original_step(batches, max_grad_norm)
            self._report(sample, batches, time.perf_counter() - start)
            return sample

        def log_val_metrics(val_name, log_data, metric_logger=None):
            from primus.runtime.metrics import EvalReport

            ctx.report_eval(EvalReport(step=int(log_data.step) + 1, loss=float(log_data.metrics["val_loss"]),
                                       name="valid" if val_name == "default" else str(val_name)))
            return original_val(val_name, log_data, metric_logger)

        recipe._run_train_optim_step = run_train_optim_step
        recipe.log_val_metrics = log_val_metrics
        self._handles = [handle for optimizer in recipe.optimizer for handle in (
            optimizer.register_step_pre_hook(lambda *_: clock.enter("optimizer")),
            optimizer.register_step_post_hook(lambda *_: clock.exit("optimizer")))]
        self._untime = time_saves_and_validation(recipe, clock)
        # Primus prints one [TRAIN] line per step; AutoModel's tqdm bar would break those lines on a terminal
        recipe._make_progress_bar = lambda *args, **kwargs: None

    def _report(self, sample: Any, batches: list, elapsed: float) -> None:
        from primus.runtime.metrics import StepReport

        metrics = sample.metrics
        tokens = int(metrics.get("num_tokens_per_step") or 0)
        dp = max(1, int(self.recipe._get_dp_group_size() or 1))
        samples = sum(int(b["labels"].shape[0]) for b in batches) * dp
        grad_norm = metrics.get("grad_norm")
        self.ctx.report_step(StepReport(
            step=int(sample.step) + 1, loss=float(metrics["loss"]), step_time_s=elapsed, samples=samples,
            tokens=tokens, flops=self.flops_per_token * tokens if self.flops_per_token and tokens else None,
            lr=float(metrics["lr"]), grad_norm=float(grad_norm) if grad_norm is not None else None))
        self.steps += 1
        if self.ctx.should_stop():
            self.recipe.step_scheduler.sigterm_flag = True  # AutoModel checkpoints this step and ends the loop

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._untime()
        for name in ("_run_train_optim_step", "log_val_metrics", "_make_progress_bar"):
            self.recipe.__dict__.pop(name, None)


