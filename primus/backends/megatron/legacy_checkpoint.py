"""Megatron-LM's legacy checkpoints (``ckpt_format: torch``): one ``torch.save`` file per model-parallel rank.

The layout and the contents are Megatron-LM's (``megatron/training/checkpointing.py``:
``get_checkpoint_name``, ``generate_state_dict``, ``save_checkpoint``, ``load_checkpoint``)::

    <root>/latest_checkpointed_iteration.txt            the newest iteration, or "release"
    <root>/iter_0000010/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt
    <root>/iter_0000010/mp_rank_TT[_PPP][_EEE]/distrib_optim.pt   (use_distributed_optimizer)
    <root>/release/mp_rank_TT/model_optim_rng.pt                    (a converted model: weights only)

TT is the tensor-parallel rank, PPP the pipeline rank (only with pipeline parallelism), EEE the
expert-parallel rank (only with expert parallelism). Each file holds ``args`` (an
``argparse.Namespace``; ``consumed_train_samples`` is the data position), ``checkpoint_version``
(3.0), ``iteration``, ``model`` (``model0``, ``model1`` ... per virtual pipeline stage: the
unwrapped module's ``state_dict_for_save_checkpoint()``), ``optimizer``, ``opt_param_scheduler``,
``rng_state`` (a list, one entry per data-parallel rank with ``data_parallel_random_init``) and
``num_floating_point_operations_so_far``. Only the first data-parallel replica writes.

Legacy checkpoints are not resharded: the run's tensor and pipeline sizes must be the
checkpoint's (Megatron-LM asserts the same). Files are read with ``torch.load(weights_only=True)``:
megatron-core registers the classes Megatron-LM's checkpoints hold (``argparse.Namespace``,
numpy RNG state ...) as safe, so nothing else is unpickled.
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

from primus.config.errors import ConfigError

FILE = "model_optim_rng.pt"
DISTRIB_OPTIM_FILE = "distrib_optim.pt"
RELEASE = "release"
CHECKPOINT_VERSION = 3.0


def is_legacy(directory: Path) -> bool:
    """Megatron-LM's own test (``_get_checkpoint_format``): a ``mp_rank_0*`` entry in the directory."""
    return Path(directory).is_dir() and any(p.name.startswith("mp_rank_0") for p in Path(directory).iterdir())


def rank_dir_name(tensor_rank: int, pipeline_rank: int | None = None, expert_rank: int | None = None) -> str:
    """``get_checkpoint_name``'s directory: ``mp_rank_TT``, ``_PPP`` with pipeline, ``_EEE`` with experts."""
    name = f"mp_rank_{tensor_rank:02d}"
    if pipeline_rank is not None:
        name += f"_{pipeline_rank:03d}"
    if expert_rank is not None:
        name += f"_{expert_rank:03d}"
    return name


def this_rank_file(directory: Path, basename: str = FILE) -> Path:
    from megatron.core import parallel_state as ps

    pipeline = ps.get_pipeline_model_parallel_rank() if ps.get_pipeline_model_parallel_world_size() > 1 else None
    expert = ps.get_expert_model_parallel_rank() if ps.get_expert_model_parallel_world_size() > 1 else None
    return Path(directory) / rank_dir_name(ps.get_tensor_model_parallel_rank(), pipeline, expert) / basename


def unwrap(chunk):
    """The module under DDP / FSDP / Float16Module, as Megatron-LM's ``unwrap_model``."""
    from megatron.core.distributed import DistributedDataParallel, TorchFullyShardedDataParallel
    from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel
    from megatron.core.transformer.module import Float16Module

    wrappers = (DistributedDataParallel, TorchFullyShardedDataParallel, FullyShardedDataParallel, Float16Module)
    while isinstance(chunk, wrappers):
        chunk = chunk.module
    return chunk


def _model_key(chunks: list, i: int) -> str:
    return "model" if len(chunks) == 1 else f"model{i}"


def _plain(value) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return value is None or isinstance(value, (str, int, float, bool))


def checkpoint_args(args, *, consumed_samples: int, world_size: int, data_parallel_size: int) -> argparse.Namespace:
    """The ``args`` Megatron-LM stores: its argument namespace (every Megatron-LM argument by dest,
    plain values only) plus the counters its loader reads back."""
    from primus.backends.megatron.schema import megatron_lm_table

    values = {dest: getattr(args, dest) for dest in megatron_lm_table() if _plain(getattr(args, dest, None))}
    return argparse.Namespace(**values, consumed_train_samples=consumed_samples, skipped_train_samples=0,
                              consumed_valid_samples=0, world_size=world_size, data_parallel_size=data_parallel_size)


def _rng_states(args) -> list[dict]:
    """``get_rng_state``: this rank's streams; every data-parallel rank's with ``data_parallel_random_init``."""
    import torch
    from megatron.core import parallel_state

    from primus.backends.megatron.checkpoint import rng_streams

    state = rng_streams()
    dp = parallel_state.get_data_parallel_world_size()
    if args.data_parallel_random_init and dp > 1:
        states = [None] * dp
        torch.distributed.all_gather_object(states, state, group=parallel_state.get_data_parallel_group())
        return states
    return [state]


def save(target: Path, chunks, optimizer, scheduler, args, *, iteration: int, consumed_samples: int,
         save_optimizer: bool, save_rng: bool) -> None:
    """Write this rank's part of ``target`` (``<root>/iter_NNNNNNN``) in Megatron-LM's legacy layout (the
    caller then writes the tracker, once every rank has saved)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    own_file = this_rank_file(target)
    own_file.parent.mkdir(parents=True, exist_ok=True)
    rng = _rng_states(args) if save_rng else None
    if save_optimizer and args.use_distributed_optimizer:  # every DP rank takes part; DP rank 0 writes
        optimizer.save_parameter_state(str(own_file.with_name(DISTRIB_OPTIM_FILE)))
    if parallel_state.get_expert_data_parallel_rank() == 0:
        state = {"args": checkpoint_args(args, consumed_samples=consumed_samples, world_size=dist.get_world_size(),
                                         data_parallel_size=parallel_state.get_data_parallel_world_size()),
                 "checkpoint_version": CHECKPOINT_VERSION, "iteration": iteration,
                 "num_floating_point_operations_so_far": 0}
        for i, chunk in enumerate(chunks):
            state[_model_key(chunks, i)] = unwrap(chunk).state_dict_for_save_checkpoint()
        if save_optimizer:
            state["optimizer"] = optimizer.state_dict()
            state["opt_param_scheduler"] = scheduler.state_dict()
        if rng is not None:
            state["rng_state"] = rng
        partial = own_file.with_name(f"{own_file.name}.tmp{dist.get_rank()}")
        torch.save(state, partial)
        partial.replace(own_file)


def read(file: Path) -> dict:
    """One rank's file, as Megatron-LM reads it; a missing or unreadable one is a ConfigError naming it.

    ``weights_only`` with megatron-core's safe globals and ``bytes`` (``torch.save`` pickles with
    protocol 2, where bytes - in Transformer Engine's ``BytesIO`` extra states - are a global).
    """
    import megatron.core  # noqa: F401  (registers the safe globals Megatron-LM checkpoints need)
    import torch

    if not file.is_file():
        raise ConfigError(f"load: {file} is missing (the legacy checkpoint has no file for this rank: was it "
                          "written with other tensor / pipeline / expert parallel sizes?)")
    try:
        with torch.serialization.safe_globals([bytes]):
            return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a pickle error, a truncated zip: the file is unusable
        lines = str(exc).splitlines() or [""]
        why = next((line.strip() for line in lines if "Unsupported global" in line), lines[0])
        raise ConfigError(f"load: {file} does not load ({type(exc).__name__}: {why[:200]})") from None


def check_layout(state: dict, args, file: Path) -> None:
    """Megatron-LM's ``check_checkpoint_args``: the model shape and the TP/PP sizes must be the run's."""
    saved = state.get("args")
    if saved is None:
        return
    version_3 = (state.get("checkpoint_version") or 0) >= 3.0
    checks = ["num_layers", "hidden_size", "num_attention_heads", "tensor_model_parallel_size",
              "pipeline_model_parallel_size"]
    for key in checks:
        source = key if version_3 or key != "tensor_model_parallel_size" else "model_parallel_size"
        if not hasattr(saved, source):
            continue
        if getattr(saved, source) != getattr(args, key):
            raise ConfigError(f"load: {file} was written with {key}={getattr(saved, source)}, this run has "
                              f"{getattr(args, key)} (legacy checkpoints are not resharded; use the same value, "
                              "or convert the checkpoint to torch_dist with Megatron-LM)")


def te_key_names(module) -> dict[str, str]:
    """model key -> the key the same tensor has in a Transformer Engine model (``linear_qkv.layer_norm_weight``
    for ``input_layernorm.weight``): each layer's own ``sharded_state_dict_keys_map``, which megatron-core
    applies to make local and TE checkpoints interchangeable."""
    from megatron.core.transformer.transformer_layer import TransformerLayer

    names = {}
    keys = list(module.state_dict().keys())
    for name, layer in module.named_modules():
        if not isinstance(layer, TransformerLayer):
            continue
        prefix = f"{name}."
        for old, new in layer.submodules_config.sharded_state_dict_keys_map.items():
            for key in keys:
                if key.startswith(prefix + old):
                    names[key] = prefix + new + key[len(prefix + old):]
    return names


def model_state_for(module, saved: dict, file: Path, log) -> dict:
    """The checkpoint's tensors under this module's keys: Transformer Engine names translated, TE's
    ``_extra_state`` (FP8 metadata) of a GPU checkpoint dropped with a note; anything else missing or extra
    is a ConfigError (strict, as Megatron-LM loads)."""
    own = module.state_dict()
    te_names = te_key_names(module)
    state, used = {}, set()
    for key in own:
        for candidate in (key, te_names.get(key)):
            if candidate is not None and candidate in saved:
                state[key] = saved[candidate]
                used.add(candidate)
                break
    missing = [k for k in own if k not in state and not k.endswith("._extra_state")]
    extra = [k for k in saved if k not in used]
    dropped = [k for k in extra if k.endswith("._extra_state")]
    unknown = [k for k in extra if not k.endswith("._extra_state")]
    if missing or unknown:
        raise ConfigError(f"load: {file} does not match the model built here: "
                          f"{len(missing)} missing (first: {missing[:2]}), {len(unknown)} unexpected "
                          f"(first: {unknown[:2]})")
    if dropped:
        log("load", f"{len(dropped)} _extra_state entries", f"{file.parent.name}: Transformer Engine's FP8 metadata, "
            "no layer here keeps any")
    return state


def restore_rng(states: list[dict], args, log) -> None:
    """``load_checkpoint``'s RNG restore; tracker streams of another device type (a GPU checkpoint's CUDA
    generators on a CPU run, or back) are left as seeded, with a note."""
    import numpy
    import torch
    from megatron.core import parallel_state, tensor_parallel

    state = states[parallel_state.get_data_parallel_rank()] if args.data_parallel_random_init else states[0]
    random.setstate(state["random_rng_state"])
    numpy.random.set_state(state["np_rng_state"])
    torch.set_rng_state(state["torch_rng_state"])
    on_gpu = torch.cuda.is_available()
    if on_gpu and "cuda_rng_state" in state:
        torch.cuda.set_rng_state(state["cuda_rng_state"])
    tracker = state.get("rng_tracker_states") or {}
    size = (torch.cuda.get_rng_state() if on_gpu else torch.get_rng_state()).numel()
    if all(torch.is_tensor(s) and s.numel() == size for s in tracker.values()):
        tensor_parallel.get_cuda_rng_tracker().set_states(tracker)
    else:
        log("load", "rng_tracker_states", "the checkpoint's tensor-parallel RNG streams are another device's "
            "generators: this run keeps its own (seeded) streams")


def load(source: Path, chunks, optimizer, args, *, with_optimizer: bool, with_rng: bool, log) -> tuple[dict, int]:
    """Load this rank's file of ``source`` into the model chunks (and optimizer, scheduler state, RNG);
    returns (the file's state, consumed samples). The scheduler is the caller's (its state is returned)."""
    file = this_rank_file(source)
    state = read(file)
    check_layout(state, args, file)
    for i, chunk in enumerate(chunks):
        key = _model_key(chunks, i)
        if key not in state:
            raise ConfigError(f"load: {file} has no '{key}' (it holds {len(chunks) if key != 'model' else 1} "
                              "model chunk(s) per rank: another virtual pipeline size?)")
        module = unwrap(chunk)
        module.load_state_dict(model_state_for(module, state[key], file, log), strict=False)
    if with_optimizer:
        if "optimizer" not in state:
            raise ConfigError(f"load: {file} holds no optimizer state (saved with no_save_optim?); "
                              "set no_load_optim: true or finetune: true")
        optimizer.load_state_dict(state["optimizer"])
        if args.use_distributed_optimizer:
            optimizer.load_parameter_state(str(file.with_name(DISTRIB_OPTIM_FILE)))
    if with_rng and state.get("rng_state"):
        restore_rng(state["rng_state"], args, log)
    consumed = getattr(state.get("args"), "consumed_train_samples", 0) or 0
    return state, int(consumed)
