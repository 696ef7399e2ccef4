"""A finished (or interrupted) run's checkpoint -> a Hugging Face model folder.

The run directory says everything needed: ``config.resolved.yaml`` names the backend, the model
and where it started from. The run's plan is rebuilt and its recipe reads the checkpoint whole,
whatever TP/PP/DP layout wrote it, as Hugging Face tensors (``Recipe.export``: each engine knows
its own layout and state-dict mapping). Written here: ``config.json`` + ``*.safetensors`` + the
tokenizer files, which ``transformers.AutoModelForCausalLM.from_pretrained`` loads. When the run
started from a HF checkpoint its ``config.json`` is kept (only the dtype follows the weights), so a
model goes out exactly as it came in; otherwise it is written from the run's ``ModelSpec``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from primus.config.errors import ConfigError
from primus.hf.export_target import check_target, claimed, write_atomically
from primus.plan.model import ModelSpec

Warn = Callable[[str], None]

DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class Exported:
    out_dir: Path
    checkpoint: Path
    step: int
    tensors: int


def _plan(run_dir: Path, name: str, section: dict[str, Any]):
    """The run's own plan, rebuilt from its resolved config (as each of its workers did)."""
    from primus.runtime.adapter import ModuleConfig
    from primus.runtime.registry import get_adapter

    framework = section.get("framework")
    adapter = get_adapter(framework, f"{run_dir}: framework")
    module = ModuleConfig(name, framework, adapter.canonical_stage(section.get("stage", "pretrain")), section["params"])
    return adapter.plan(module, None, run_dir=run_dir, device="cpu")


def _config(source: Path | None, spec: ModelSpec, dtype: str, tokenizer: str | None) -> dict[str, Any]:
    from primus.hf.config import hf_config_from_spec, read_config

    if source is not None:
        config = dict(read_config(source))
        config["dtype"] = dtype
        if "torch_dtype" in config:
            config["torch_dtype"] = dtype
        return config
    tokens = {}
    if tokenizer and Path(tokenizer).is_dir():
        from primus.data.sft import load_tokenizer

        loaded = load_tokenizer(tokenizer)
        tokens = {"bos_token_id": loaded.bos_token_id, "eos_token_id": loaded.eos_token_id,
                  "pad_token_id": loaded.pad_token_id}
    return hf_config_from_spec(spec, dtype=dtype, tokens=tokens)


def export_run(run_dir: str | Path, out_dir: str | Path, *, step: int | None = None, module: str | None = None,
               dtype: str | None = None, warn: Warn | None = None) -> Exported:
    """Write the run's checkpoint (latest whole one, or ``step``) as a HF model folder ``out_dir``
    (new or empty), atomically; a damaged newer checkpoint is skipped with ``warn``."""
    from primus.runtime.rundir import RunDir

    out = check_target(out_dir)  # before anything is read: a bad OUT_DIR costs nothing
    if step is not None and step < 0:
        raise ConfigError(f"--step {step}: a step is ≥ 0")
    run_dir = Path(run_dir).expanduser().absolute()
    name, section = RunDir(run_dir).read_module(module)
    plan = _plan(run_dir, name, section)
    with claimed(out):
        weights = plan.recipe.export(plan, step, warn)  # each engine's recipe reads its own checkpoint layout
        hf, config = _as_hf_model(weights.tensors, weights.model, weights.source, weights.tokenizer,
                                  weights.checkpoint, dtype)
        from primus.hf.checkpoint import save_hf_checkpoint

        tokenizer_from = weights.source or weights.tokenizer
        write_atomically(out, lambda folder: save_hf_checkpoint(folder, hf, config, tokenizer_from=tokenizer_from))
    return Exported(out, weights.checkpoint, weights.step, len(hf))


def _as_hf_model(hf: dict[str, Any], spec: ModelSpec, source: Path | None, tokenizer: str | None, path: Path,
                 dtype: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tensors a HF model of ``spec`` holds (cast to ``dtype``) and its ``config.json``."""
    import torch

    from primus.hf.checkpoint import expected_shapes

    expected = expected_shapes(spec)
    missing = sorted(set(expected) - set(hf))
    if missing:
        raise ConfigError(f"{path}: the checkpoint has no {missing[0]} ({len(missing)} tensors missing)")
    hf = {k: v for k, v in hf.items() if k in expected}
    if dtype is not None:
        hf = {k: v.to(getattr(torch, dtype)) for k, v in hf.items()}
    stored = str(next(iter(hf.values())).dtype).removeprefix("torch.")
    return hf, _config(source, spec, stored, tokenizer)
