"""Check that the bare-engine baseline gets the *identical* native config Primus builds.

    python -m benchmarks.parity torchtitan RUN_DIR BARE_ARGS...   -> prints {"equal": ..., "diff": ...}
    python -m benchmarks.parity nemo_automodel RUN_DIR BARE_ARGS...
    python -m benchmarks.parity megatron RUN_DIR BARE_ARGS...

RUN_DIR is a finished Primus run (its config.resolved.yaml is what the worker read).
"""
from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import hashlib
import inspect
import json
import os
import re
import socket
import sys
from pathlib import Path

import yaml


def _diff(a: str, b: str) -> list[str]:
    return [line for line in difflib.unified_diff(a.splitlines(), b.splitlines(), "primus", "bare", lineterm="", n=0)
            if not line.startswith(("---", "+++", "@@"))][:20]


def torchtitan(run_dir: Path, bare_argv: list[str]) -> dict:
    from primus.backends.torchtitan.patches import apply_patches

    apply_patches()
    from benchmarks.bare import torchtitan_bare
    from primus.backends.torchtitan.recipes.pretrain import with_tiny_assets
    from primus.backends.torchtitan.config import build_trainer_config

    params = yaml.safe_load((run_dir / "config.resolved.yaml").read_text())["modules"]["pre_trainer"]["params"]
    args = torchtitan_bare.parse_args(bare_argv)
    primus_cfg, _, _ = build_trainer_config(with_tiny_assets(params), run_dir=Path(args.dump).absolute(),
                                            device="cpu")
    bare_cfg = torchtitan_bare.build_config(args)
    # closures built per call differ only by address: compare everything else
    a, b = (re.sub(r" at 0x[0-9a-f]+", "", repr(c)) for c in (primus_cfg, bare_cfg))
    return {"equal": a == b, "diff": _diff(a.replace(", ", ",\n"), b.replace(", ", ",\n"))}


def nemo_automodel(run_dir: Path, bare_argv: list[str]) -> dict:
    import argparse

    from benchmarks.bare.automodel_bare import load_config
    from primus.backends.nemo_automodel.config import build_handoff

    p = argparse.ArgumentParser()
    p.add_argument("--assets")
    p.add_argument("--run-dir")
    p.add_argument("--set", action="append", default=[], dest="sets")
    args = p.parse_args(bare_argv)
    params = yaml.safe_load((run_dir / "config.resolved.yaml").read_text())["modules"]["pre_trainer"]["params"]
    bare_run = str(Path(args.run_dir).absolute())
    handoff = build_handoff(params, stage="pretrain", checkpoint_dir=Path(bare_run) / "checkpoints", resume=False,
                            dist_backend="gloo", log=lambda m: None, log_derived=lambda *a: None).automodel
    bare = load_config(args.assets, bare_run, args.sets)
    a, b = yaml.safe_dump(handoff, sort_keys=True), yaml.safe_dump(bare, sort_keys=True)
    return {"equal": a == b, "diff": _diff(a, b)}


# The megatron-core entry points a Megatron job is built through; parity records every call.
MEGATRON_CALLS = (
    ("megatron.core.parallel_state", "initialize_model_parallel"),
    ("megatron.core.num_microbatches_calculator", "init_num_microbatches_calculator"),
    ("megatron.core.tensor_parallel", "model_parallel_cuda_manual_seed"),
    ("megatron.core.models.gpt", "GPTModel"),
    ("megatron.core.distributed", "DistributedDataParallel"),
    ("megatron.core.optimizer", "get_megatron_optimizer"),
    ("megatron.core.optimizer_param_scheduler", "OptimizerParamScheduler"),
    ("megatron.core.datasets.blended_megatron_dataset_builder", "BlendedMegatronDatasetBuilder"),
)


def _record_megatron(calls: list, models: list) -> None:
    """Wrap each entry point (module attribute, looked up at call time by Primus and the bare
    script alike) so that its arguments, bound to its signature with defaults, are recorded."""
    import importlib

    for module_name, attr in MEGATRON_CALLS:
        module = importlib.import_module(module_name)
        real = getattr(module, attr)

        def wrapper(*a, _real=real, _name=attr, **kw):
            bound = inspect.signature(_real).bind(*a, **kw)
            bound.apply_defaults()
            calls.append((_name, dict(bound.arguments)))
            result = _real(*a, **kw)
            if _name == "GPTModel":
                models.append(result)
            return result

        setattr(module, attr, wrapper)


def _canon(value, path: str, out: list[str]) -> None:
    """Flatten ``value`` into ``path = text`` lines; objects by type, config dataclasses field by field."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out.append(f"{path} = <{type(value).__qualname__}>")
        for f in dataclasses.fields(value):
            _canon(getattr(value, f.name), f"{path}.{f.name}", out)
    elif isinstance(value, dict):
        for key, item in value.items():
            _canon(item, f"{path}.{key}", out)
    elif hasattr(value, "eod") and hasattr(value, "vocab_size"):  # tokenizer: all GPTDataset reads from it
        out.append(f"{path} = tokenizer(vocab_size={value.vocab_size}, eod={value.eod})")
    else:
        out.append(f"{path} = {_text(value)}")


def _text(value) -> str:
    import torch

    if isinstance(value, functools.partial):
        return f"partial({_text(value.func)}, {[_text(a) for a in value.args]}, " \
               f"{ {k: _text(v) for k, v in value.keywords.items()} })"
    if inspect.ismethod(value):
        return f"<bound {type(value.__self__).__qualname__}.{value.__func__.__name__}>"
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    if callable(value) and hasattr(value, "__name__") and not isinstance(value, torch.nn.Module):
        # Primus's and the bare script's own lambdas live in different modules: compare by name
        return "<lambda>" if value.__name__ == "<lambda>" else f"{getattr(value, '__module__', '')}.{value.__name__}"
    if isinstance(value, (list, tuple)):
        return type(value).__name__ + "(" + ", ".join(_text(v) for v in value) + ")"
    if isinstance(value, (torch.nn.Module, torch.optim.Optimizer)) or type(value).__module__.startswith(
            "megatron.core.optimizer"):
        return f"<{type(value).__qualname__}>"
    if isinstance(value, (torch.dtype, enum.Enum)):
        return str(value)
    return re.sub(r" at 0x[0-9a-f]+", "", repr(value))


def _megatron_lines(calls: list, models: list) -> list[str]:
    out: list[str] = []
    for i, (name, arguments) in enumerate(calls):
        _canon(arguments, f"{i}:{name}", out)
    for i, model in enumerate(models):  # same seeds, RNG streams and init order -> the same weights
        digest = hashlib.sha256()
        for pname, param in model.named_parameters():
            digest.update(pname.encode())
            digest.update(param.detach().contiguous().numpy().tobytes())
        out.append(f"GPTModel#{i}.initial_weights = sha256:{digest.hexdigest()[:16]}")
    return out


def megatron(run_dir: Path, bare_argv: list[str]) -> dict:
    """Build both jobs in this process (setup only, no training) with every megatron-core entry
    point recorded: the TransformerConfig, GPTModel arguments, DistributedDataParallelConfig,
    OptimizerConfig, OptimizerParamScheduler arguments, GPTDatasetConfig and sample counts, the
    parallel state / micro-batch calculator / seed calls, and the initial weights must match."""
    import logging
    from types import SimpleNamespace

    from primus.backends.megatron.patches import PATCHES
    from primus.runtime.patches import NO_GPU, Where, apply_for_process

    apply_for_process([patch for patch in PATCHES if patch.when is NO_GPU], Where.here(()))  # the CPU shims
    calls: list = []
    models: list = []
    _record_megatron(calls, models)
    from benchmarks.bare import megatron_bare
    from primus.backends.megatron.adapter import megatron_params
    from primus.backends.megatron.arguments import parse_args
    from primus.backends.megatron.trainer import MegatronTrainer

    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ[key] = value
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    params = yaml.safe_load((run_dir / "config.resolved.yaml").read_text())["modules"]["pre_trainer"]["params"]
    ctx = SimpleNamespace(device="cpu", rank=0, local_rank=0, world_size=1, dist_backend="gloo", resume=False,
                          checkpoint_dir=run_dir / "checkpoints",  # setup only reads it, and only on resume
                          logger=logging.getLogger("parity"), log_derived=lambda *a: None)
    trainer = MegatronTrainer(parse_args(megatron_params(params)), ctx)
    try:
        trainer.setup()
        primus = _megatron_lines(calls, models)
    finally:
        trainer.close()
    calls.clear()
    models.clear()
    try:
        megatron_bare.setup(megatron_bare.parse_args(bare_argv))
        bare = _megatron_lines(calls, models)
    finally:
        megatron_bare.teardown()
    a, b = "\n".join(primus), "\n".join(bare)
    return {"equal": a == b, "diff": _diff(a, b), "checked": len(primus)}


if __name__ == "__main__":
    backend, run_dir, *rest = sys.argv[1:]
    print(json.dumps(globals()[backend](Path(run_dir), rest)))
