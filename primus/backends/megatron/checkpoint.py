"""Megatron checkpoints in Megatron-LM's layout, in the format ``ckpt_format`` names.

``<dir>/latest_checkpointed_iteration.txt`` names the newest ``<dir>/iter_0000010/``, which holds
the model chunks, the optimizer, the LR scheduler, the data position (``consumed_samples``) and
every rank's RNG streams:

- ``torch_dist`` (Megatron-LM's default): one megatron-core ``dist_checkpointing`` checkpoint, its
  state dict assembled as Megatron-LM's ``generate_state_dict`` does, so it reshards over TP/PP/DP;
  with FSDP2 the same checkpoint, loaded into each rank's shards in place (``fsdp.py``);
- ``torch``: Megatron-LM's legacy per-rank files (``legacy_checkpoint.py``);
- ``fsdp_dtensor``: Megatron-FSDP's DCP checkpoint (``fsdp.py``, GPU only).

Loading reads whichever format the directory holds (as Megatron-LM's ``_get_checkpoint_format``
detects it), so a run may resume from a checkpoint written in another format than it saves.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from primus.backends.megatron.checkpoint_names import ITERATION, RELEASE, TRACKER, iteration_dir, latest_iteration
from primus.backends.megatron.rng import rng_streams
from primus.config.errors import ConfigError
from primus.runtime.checkpoints import check_model_matches, gathered, save_errors

class SaveFailed(RuntimeError):
    """A checkpoint save failed on at least one rank; raised on every rank."""


def agree(action: Callable[[], object] | None, what: str) -> None:
    """Run ``action`` here (None: nothing to do on this rank), then let every rank know whether any failed."""
    import torch.distributed as dist

    error = None
    if action is not None:
        try:
            action()
        except save_errors() as exc:  # any failure of a save step: every rank must hear of it
            error = f"{what}: {type(exc).__name__}: {exc}"
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    failed = [(rank, e) for rank, e in enumerate(errors) if e is not None]
    if failed:
        rank, first = failed[0]
        raise SaveFailed(f"rank {rank}: {first}" + (f" (and {len(failed) - 1} more rank(s))" if len(failed) > 1 else ""))


def _rng_state():
    """This rank's RNG streams as a ShardedObject over (PP, TP), replicated across DP (Megatron-LM)."""
    from megatron.core import parallel_state
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    pp_size = parallel_state.get_pipeline_model_parallel_world_size()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    return ShardedObject("rng_state", [rng_streams()], (pp_size, tp_size), (pp_rank, tp_rank),
                         replica_id=parallel_state.get_data_parallel_rank(with_context_parallel=True))


def _restore_rng(sharded) -> None:
    import numpy
    import torch
    from megatron.core import tensor_parallel

    state = sharded[0] if isinstance(sharded, list) else sharded
    random.setstate(state["random_rng_state"])
    numpy.random.set_state(state["np_rng_state"])
    torch.set_rng_state(state["torch_rng_state"])
    if "cuda_rng_state" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda_rng_state"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["rng_tracker_states"])


def _metadata(args, saved: dict | None = None) -> dict:
    """Megatron-LM's ``_build_sharded_state_dict_metadata``; loading follows the checkpoint's own optimizer
    sharding type (its ``content_metadata``), as Megatron-LM's ``load_checkpoint`` does."""
    metadata = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    if args.use_distributed_optimizer:
        metadata["distrib_optim_sharding_type"] = "dp_reshardable"
        if saved and saved.get("distrib_optim_sharding_type"):
            metadata["distrib_optim_sharding_type"] = saved["distrib_optim_sharding_type"]
    return metadata


def _materialize_adam_state(optimizer) -> None:
    """Give a never-stepped torch Adam inside Megatron's DistributedOptimizer its (zero) state.

    Why: without Transformer Engine / Apex (always on CPU), megatron-core 0.16
    ``DistributedOptimizer.sharded_state_dict(is_loading=True)`` calls ``self.state_dict()``,
    which asserts that every torch-Adam state has one common ``step``; a fresh optimizer has
    no state at all, so resuming with ``use_distributed_optimizer`` fails before loading. The
    zeros placed here are overwritten by the checkpoint; parameters are not touched.
    """
    import torch
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        if not isinstance(inner, DistributedOptimizer) or not isinstance(inner.optimizer, torch.optim.Adam | torch.optim.AdamW):
            continue
        for group in inner.optimizer.param_groups:
            for param in group["params"]:
                if not inner.optimizer.state[param]:
                    inner.optimizer.state[param] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(param),
                                                    "exp_avg_sq": torch.zeros_like(param)}


def _restore_adam_steps(optimizer, loaded: dict) -> None:
    """Set each parameter's Adam ``step`` from the checkpoint, as its own tensor.

    Why: without Transformer Engine / Apex, megatron-core 0.16
    ``DistributedOptimizer.load_state_dict`` (a) assigns ONE shared ``step`` tensor to every
    parameter (torch Adam's in-place ``step += 1`` then counts once per parameter), and (b)
    then overwrites it with the placeholder ``step`` of the loading state dict (0 here, see
    ``_materialize_adam_state``). Either breaks Adam's bias correction after a resume. The
    true step is the one the checkpoint records in ``param_groups``.
    """
    import torch
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    inners = getattr(optimizer, "chained_optimizers", [optimizer])
    states = loaded if len(inners) > 1 else [loaded]
    if isinstance(states, dict):
        states = [v for _, v in sorted(states.items())]
    for inner, state in zip(inners, states):
        if not isinstance(inner, DistributedOptimizer):
            continue
        steps = {g.get("step") for g in state["optimizer"]["param_groups"]} - {None}
        if len(steps) != 1:
            continue
        step = float(steps.pop())
        for param_state in inner.optimizer.state.values():
            if "step" in param_state:
                param_state["step"] = torch.tensor(step)


def _state_dict(chunks, optimizer, scheduler, *, iteration: int, consumed_samples: int, metadata: dict,
                is_loading: bool, with_optimizer: bool, with_rng: bool) -> dict:
    state = {"checkpoint_version": 3.0, "iteration": iteration, "consumed_samples": consumed_samples}
    for i, chunk in enumerate(chunks):
        key = "model" if len(chunks) == 1 else f"model{i}"
        state[key] = chunk.module.sharded_state_dict(prefix="", metadata=metadata)
    if with_optimizer:
        state["optimizer"] = optimizer.sharded_state_dict(state, is_loading=is_loading, metadata=metadata)
        state["opt_param_scheduler"] = scheduler.state_dict()
    if with_rng:
        state["rng_state"] = _rng_state()
    return state


def follow_this_launchs_schedule(scheduler, saved: dict) -> None:
    """A resumed run continues with this launch's LR / weight-decay schedule (``--resume
    train_iters=6`` after a 4-iteration run), as TorchTitan does, and says what changed.

    megatron-core's ``OptimizerParamScheduler.load_state_dict`` asserts that every setting equals
    the checkpoint's unless ``override_opt_param_scheduler`` (this launch's values) or
    ``use_checkpoint_opt_param_scheduler`` (the checkpoint's) is set; Megatron-LM leaves the choice
    to those flags and fails without one. Primus keeps an explicit flag, else overrides. The step
    count (``num_steps``) is the checkpoint's either way."""
    import logging

    if scheduler.override_opt_param_scheduler or scheduler.use_checkpoint_opt_param_scheduler:
        return
    current = scheduler.state_dict()
    changed = [f"{key} {saved[key]} -> {value}" for key, value in current.items()
               if key != "num_steps" and key in saved and saved[key] != value]
    if changed:
        scheduler.override_opt_param_scheduler = True
        logging.getLogger("primus.checkpoints").info(
            "derived override_opt_param_scheduler=true (resumed with other schedule settings than the checkpoint's: "
            "%s; this launch's apply, from the saved step on; use_checkpoint_opt_param_scheduler: true keeps the "
            "checkpoint's)", ", ".join(changed))


def model_shapes(state: dict) -> dict[str, tuple[int, ...]]:
    """Global shape of every model tensor of a sharded state dict, under its torch_dist key (a layer
    stack's first axis counts the layers; SwiGLU's factories are built to the tensors they save)."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    shapes: dict[str, tuple[int, ...]] = {}
    pending = [value for key, part in state.items() if key.startswith("model") for value in nested_values(part)]
    while pending:
        value = pending.pop(0)
        if isinstance(value, ShardedTensorFactory):
            built = value.build()
            pending[:0] = list(nested_values(built)) if isinstance(built, (dict, list)) else [built]
        elif isinstance(value, ShardedTensor):
            shapes[value.key] = tuple(value.global_shape)
    return shapes


def _write_tracker(root: Path, iteration: int) -> None:
    """Rank 0 points the tracker at ``iteration`` once every rank has saved; a failure is every rank's."""
    import torch.distributed as dist

    def write() -> None:
        tmp = Path(root) / (TRACKER + ".tmp")
        tmp.write_text(str(iteration))
        tmp.replace(Path(root) / TRACKER)

    dist.barrier()
    agree(write if dist.get_rank() == 0 else None, f"writing {Path(root) / TRACKER}")


def save_checkpoint(root: Path, chunks, optimizer, scheduler, args, *, iteration: int, consumed_samples: int,
                    async_save: bool = False):
    """Save ``iter_NNNNNNN`` under ``root`` in ``args.ckpt_format``, then point the tracker at it. With
    ``async_save`` (torch_dist) the files are written by megatron-core's async request, returned to be
    scheduled; the tracker moves in its finalize step, once every rank has written (Megatron-LM)."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    from primus.backends.megatron import reshard
    save_optimizer, save_rng = not args.no_save_optim, not args.no_save_rng
    target = iteration_dir(root, iteration)
    agree((lambda: target.mkdir(parents=True, exist_ok=True)) if dist.get_rank() == 0 else None, f"creating {target}")
    if args.ckpt_format == "torch":
        from primus.backends.megatron import legacy_checkpoint

        agree(lambda: legacy_checkpoint.save(target, chunks, optimizer, scheduler, args, iteration=iteration,
                                             consumed_samples=consumed_samples, save_optimizer=save_optimizer,
                                             save_rng=save_rng), f"writing {target}")
    elif args.ckpt_format == "fsdp_dtensor":
        from primus.backends.megatron.fsdp import save_fsdp_dtensor

        save_fsdp_dtensor(target, chunks, optimizer, scheduler, args, iteration=iteration,
                          consumed_samples=consumed_samples, rng_state=[rng_streams()] if save_rng else None)
    else:
        metadata = _metadata(args)
        state = _state_dict(chunks, optimizer, scheduler, iteration=iteration, consumed_samples=consumed_samples,
                            metadata=metadata, is_loading=False, with_optimizer=save_optimizer, with_rng=save_rng)
        state[reshard.LAYOUT_KEY] = reshard.run_layout(args, dist.get_world_size())  # checked before a resume
        request = dist_checkpointing.save(state, str(target), _save_strategy(args), content_metadata=metadata,
                                          async_sharded_save=async_save)
        if request is not None:
            request.add_finalize_fn(lambda: _write_tracker(root, iteration))
            return request
    _write_tracker(root, iteration)
    return None


def _save_strategy(args):
    """megatron-core's torch_dist writer with ``dist_ckpt_workers`` writer processes per rank (Megatron-LM's
    argument, default 1), as Megatron Bridge builds it; the strategy's own default is 2."""
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy

    strategy = get_default_save_sharded_strategy("torch_dist")
    strategy.thread_count = max(1, int(args.dist_ckpt_workers))
    return strategy


def load_checkpoint(root: Path, chunks, optimizer, scheduler, args, log) -> tuple[int, int]:
    """Restore the latest checkpoint under ``root``; returns (iteration, consumed_samples).

    ``log(key, value, reason)`` says what loading decided (a derived line). Runs under
    ``no_grad``: with fp32 parameters the distributed optimizer's main parameters are views of
    the model's leaf parameters, and megatron-core's ``load_parameter_state_from_dp_reshardable``
    copies into them in place (autograd refuses).
    """
    import torch

    with torch.no_grad():
        return _load_checkpoint(root, chunks, optimizer, scheduler, args, log)


def _source(root: Path) -> tuple[Path, int, bool]:
    """(directory, iteration, release) of the checkpoint the tracker names: the newest whole one at or
    before it (a damaged newer one is skipped with a warning), or Megatron-LM's ``release`` directory."""
    from primus.runtime.checkpoints import newest_usable, problem_of

    tracker = Path(root) / TRACKER
    if tracker.is_file() and tracker.read_text().strip() == RELEASE:
        source = Path(root) / RELEASE
        problem = problem_of(source)
        if problem:
            raise ConfigError(f"load: {problem}")
        return source, 0, True
    iteration = latest_iteration(root)
    if iteration is None:
        raise FileNotFoundError(f"no {TRACKER} under {root}")
    iteration = newest_usable(root, ITERATION, at_most=iteration)
    if iteration is None:
        raise FileNotFoundError(f"no finished checkpoint under {root}")
    return iteration_dir(root, iteration), iteration, False


def _load_checkpoint(root: Path, chunks, optimizer, scheduler, args, log) -> tuple[int, int]:
    """``finetune`` (and a ``release`` checkpoint) loads only the weights and restarts at iteration 0
    (Megatron-LM semantics); the parameters' fp32 main copies then follow the loaded weights."""
    import torch
    from megatron.core import dist_checkpointing

    from primus.backends.megatron import fsdp, legacy_checkpoint, reshard

    source, iteration, release = _source(root)
    with_optimizer = not (args.finetune or args.no_load_optim or release)
    with_rng = not (args.finetune or args.no_load_rng or release)
    layout = reshard.run_layout(args, torch.distributed.get_world_size())
    problem = reshard.resume_problem(source, layout, load_optimizer=with_optimizer)
    if problem:  # said before launch too; here for a run whose world changed since (an elastic restart)
        raise ConfigError(f"load: {problem}")
    if with_rng and not reshard.rng_restorable(source, layout):
        with_rng = False
        log("no_load_rng", True, f"{source} was written at {reshard.describe(reshard.saved_layout(source))}, "
            f"this run is {reshard.describe(layout)}: the RNG streams are per (PP, TP) rank and are not "
            "restored, as in Megatron-LM")
    if legacy_checkpoint.is_legacy(source):
        if fsdp.sharding(args):
            raise ConfigError(f"load: {source} is a legacy checkpoint (ckpt_format: torch), which holds whole "
                              "tensors per model-parallel rank; FSDP runs load torch_dist (FSDP2) or fsdp_dtensor "
                              "checkpoints: save it once in ckpt_format: torch_dist from a run without FSDP")
        log("load", str(source), "Megatron-LM's legacy checkpoint layout (ckpt_format: torch)")
        state, consumed = legacy_checkpoint.load(source, chunks, optimizer, args, with_optimizer=with_optimizer,
                                                 with_rng=with_rng, log=log)
        if with_optimizer:
            _restore_adam_steps(optimizer, state["optimizer"])
            follow_this_launchs_schedule(scheduler, state["opt_param_scheduler"])
            scheduler.load_state_dict(state["opt_param_scheduler"])
        loaded_iteration = state.get("iteration", iteration)
    elif fsdp.is_fsdp_dtensor(source):
        loaded_iteration, consumed = fsdp.load_fsdp_dtensor(source, chunks, optimizer, scheduler, args,
                                                            with_optimizer=with_optimizer, with_rng=with_rng,
                                                            restore_rng=_restore_rng)
    else:
        if with_optimizer:
            _materialize_adam_state(optimizer)
        metadata = _metadata(args, dist_checkpointing.load_content_metadata(str(source)))
        state = _state_dict(chunks, optimizer, scheduler, iteration=iteration, consumed_samples=0,
                            metadata=metadata, is_loading=True, with_optimizer=with_optimizer, with_rng=with_rng)
        check_model_matches(source, gathered(model_shapes(state)),
                            lambda key: not key.startswith(("optimizer", "rng_state")))
        loaded = dist_checkpointing.load(state, str(source))
        if fsdp.is_torch_fsdp2(chunks):
            fsdp.restore_fsdp2_shards(chunks, optimizer, loaded, with_optimizer=with_optimizer)
        else:
            for i, chunk in enumerate(chunks):
                chunk.module.load_state_dict(loaded["model" if len(chunks) == 1 else f"model{i}"], strict=True)
            if with_optimizer and not reshard.load_regrouped_optimizer(optimizer, loaded["optimizer"], log):
                optimizer.load_state_dict(loaded["optimizer"])
                _restore_adam_steps(optimizer, loaded["optimizer"])
        if with_optimizer:
            follow_this_launchs_schedule(scheduler, loaded["opt_param_scheduler"])
            scheduler.load_state_dict(loaded["opt_param_scheduler"])
        if with_rng:
            _restore_rng(loaded["rng_state"])
        loaded_iteration, consumed = loaded["iteration"], loaded["consumed_samples"]
    if not with_optimizer and (args.bf16 or args.fp16):
        optimizer.reload_model_params()  # Megatron-LM: the fp32 main parameters follow the loaded weights
    if args.finetune or release:
        return 0, 0
    return int(loaded_iteration), int(consumed)
