"""Which data-parallel wrapper goes around each model chunk, as Megatron-LM's ``get_model`` picks it.

- ``use_torch_fsdp2``: megatron-core's ``TorchFullyShardedDataParallel`` (PyTorch FSDP2's
  ``fully_shard`` on every transformer layer, the embedding and the root), configured by
  ``TorchFullyShardedDataParallelConfig(reshard_after_forward=torch_fsdp2_reshard_after_forward)``
  and nothing else, as Megatron-LM does;
- ``use_megatron_fsdp``: megatron-core's Megatron-FSDP adapter
  (``megatron.core.distributed.fsdp.mcore_fsdp_adapter.FullyShardedDataParallel``, the
  ``megatron_fsdp`` sources megatron-core 0.16 ships), sharded by ``data_parallel_sharding_strategy``;
- otherwise Megatron's ``DistributedDataParallel`` (``model.wrap_ddp``).

Megatron-LM's own rules for these (``validate_args``: no pipeline or expert parallelism and an
untied output layer with FSDP2, ``ckpt_format: fsdp_dtensor`` with Megatron-FSDP ...) run when
the arguments are parsed (``validate_args.py``).
"""
from __future__ import annotations

from pathlib import Path

from primus.backends.megatron.arguments import MegatronArgs


def sharding(args: MegatronArgs) -> str | None:
    """'torch_fsdp2', 'megatron_fsdp' or None (Megatron DDP)."""
    if args.use_torch_fsdp2:
        return "torch_fsdp2"
    if args.use_megatron_fsdp:
        return "megatron_fsdp"
    return None


def _ddp_config_kwargs(args: MegatronArgs) -> dict:
    """Megatron-LM's DDP config: every ``DistributedDataParallelConfig`` field named like an argument,
    then the renamed ones (``get_model``)."""
    import dataclasses

    from megatron.core.distributed import DistributedDataParallelConfig

    kwargs = {f.name: getattr(args, f.name) for f in dataclasses.fields(DistributedDataParallelConfig)
              if f.name in type(args).model_fields}
    kwargs.update(grad_reduce_in_fp32=args.accumulate_allreduce_grads_in_fp32,
                  check_for_nan_in_grad=False,  # the trainer checks the step's values (check_for_nan_in_loss_and_grad)
                  check_for_large_grads=args.check_for_large_grads, bucket_size=args.ddp_bucket_size,
                  pad_buckets_for_high_nccl_busbw=args.ddp_pad_buckets_for_high_nccl_busbw,
                  reduce_scatter_with_fp32_accumulation=args.ddp_reduce_scatter_with_fp32_accumulation,
                  average_in_collective=args.ddp_average_in_collective)
    return kwargs


def wrap_data_parallel(args: MegatronArgs, config, chunks: list) -> list:
    """Each chunk in the data-parallel wrapper the arguments ask for (Megatron-LM's ``get_model``)."""
    kind = sharding(args)
    if kind is None:
        from primus.backends.megatron.model import wrap_ddp

        return wrap_ddp(args, config, chunks)
    if kind == "torch_fsdp2":
        from megatron.core.distributed import TorchFullyShardedDataParallel
        from megatron.core.distributed.torch_fully_sharded_data_parallel_config import (
            TorchFullyShardedDataParallelConfig,
        )

        ddp_config = TorchFullyShardedDataParallelConfig(reshard_after_forward=args.torch_fsdp2_reshard_after_forward)
        return [TorchFullyShardedDataParallel(config=config, ddp_config=ddp_config, module=chunk,
                                              disable_bucketing=i > 0) for i, chunk in enumerate(chunks)]
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel

    ddp_config = DistributedDataParallelConfig(**_ddp_config_kwargs(args))
    if ddp_config.bucket_size is None:  # Megatron-LM's default for the Megatron-FSDP and DDP paths
        from megatron.core import parallel_state

        ddp_config.bucket_size = max(40000000, 1000000 * parallel_state.get_data_parallel_world_size(
            with_context_parallel=True))
    if not ddp_config.overlap_grad_reduce:
        ddp_config.bucket_size = None
    return [FullyShardedDataParallel(config=config, ddp_config=ddp_config, module=chunk, disable_bucketing=i > 0)
            for i, chunk in enumerate(chunks)]


# -- checkpoints ---------------------------------------------------------------------------------
def is_torch_fsdp2(chunks: list) -> bool:
    from megatron.core.distributed import TorchFullyShardedDataParallel

    return isinstance(chunks[0], TorchFullyShardedDataParallel)


def _copy_into(target, value) -> None:
    """Copy a loaded tensor into a parameter's or state's local shard, unless it already is that shard."""
    local = getattr(target, "_local_tensor", target)
    if value is not local:
        local.copy_(value)


def _optimizer_states(optimizer, loaded) -> list[tuple[object, dict]]:
    """(megatron-core optimizer, its loaded state) per chained optimizer."""
    inners = getattr(optimizer, "chained_optimizers", [optimizer])
    states = loaded if len(inners) > 1 else [loaded]
    if isinstance(states, dict):
        states = [value for _, value in sorted(states.items())]
    return list(zip(inners, states))


def restore_fsdp2_shards(chunks: list, optimizer, loaded: dict, *, with_optimizer: bool) -> None:
    """Put a loaded torch_dist checkpoint into FSDP2's sharded parameters and optimizer states.

    megatron-core's sharded state dict of an FSDP2 model points at each rank's local shards, so
    ``dist_checkpointing.load`` fills most of them in place (why Megatron-LM skips
    ``load_state_dict`` for FSDP2, whose wrapper makes it a no-op); the tensors it rebuilds (the
    fused SwiGLU ``linear_fc1``, merged from its two halves) are copied into their shards here.
    The optimizer's states are copied the same way, keeping them DTensors (torch's
    ``Optimizer.load_state_dict`` would replace them by plain tensors), and each parameter gets the
    checkpoint's Adam ``step`` (saved once, as ``common_step``).
    """
    import torch

    for i, chunk in enumerate(chunks):
        saved = loaded["model" if len(chunks) == 1 else f"model{i}"]
        own = chunk.module.state_dict(keep_vars=True)
        missing = sorted(key for key in own if key not in saved and not key.endswith("._extra_state"))
        if missing:
            raise KeyError(f"the checkpoint has no {missing[:3]}")
        for key, target in own.items():
            if torch.is_tensor(target) and key in saved:
                _copy_into(target, saved[key])
    if not with_optimizer:
        return
    for inner, state in _optimizer_states(optimizer, loaded["optimizer"]):
        mixed = "fp32_from_fp16_params" in state  # Float16OptimizerWithFloat16Params wraps torch's state
        saved = state["optimizer"] if mixed else state
        step = saved["state"].pop("common_step", None)
        params = [param for group in inner.optimizer.param_groups for param in group["params"]]
        for index, param in enumerate(params):
            param_state = inner.optimizer.state[param]
            for key, value in saved["state"].get(index, {}).items():
                _copy_into(param_state[key], value)
            if step is not None:
                param_state["step"] = torch.tensor(float(step))
        if mixed:
            for group, saved_group in zip(inner.fp32_from_float16_groups, state["fp32_from_fp16_params"]):
                for main, value in zip(group, saved_group):
                    _copy_into(main, value)


def is_fsdp_dtensor(source: Path) -> bool:
    """Megatron-LM's format test: a plain DCP checkpoint (``.metadata``), not megatron-core's torch_dist
    (which adds ``metadata.json``)."""
    return (Path(source) / ".metadata").is_file() and not (Path(source) / "metadata.json").is_file()


def _fsdp_dtensor_state(chunks: list, optimizer, scheduler, args, *, iteration: int, consumed_samples: int,
                        rng_state, with_optimizer: bool, is_loading: bool) -> tuple[dict, dict]:
    """Megatron-LM's ``generate_state_dict`` for ``fsdp_dtensor`` and its ``preprocess_fsdp_dtensor_state_dict``;
    returns (the state to save or load into, the same before preprocessing: model and optimizer state dicts
    as ``load_state_dict`` takes them)."""
    from megatron.core import parallel_state
    from megatron.core.distributed.fsdp.src.megatron_fsdp.uneven_dtensor import (
        preprocess_state_dict_for_uneven_dtensor,
    )
    from megatron.core.transformer.fsdp_dtensor_checkpoint import (
        handle_experts_in_state_dict,
        handle_fp8_extra_state_case,
        handle_swiglu_in_state_dict,
    )

    from primus.backends.megatron.legacy_checkpoint import unwrap

    modules = [unwrap(chunk) for chunk in chunks]
    state = {"checkpoint_version": 3.0, "iteration": iteration, "consumed_samples": consumed_samples}
    for i, module in enumerate(modules):
        state["model" if len(modules) == 1 else f"model{i}"] = module.state_dict_for_save_checkpoint()
    if with_optimizer:
        metadata = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True,
                    "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}
        if args.use_distributed_optimizer:
            metadata["distrib_optim_sharding_type"] = "fsdp_dtensor"
        state["optimizer"] = optimizer.sharded_state_dict(state, is_loading=is_loading, metadata=metadata)
        state["opt_param_scheduler"] = scheduler.state_dict()
    if rng_state is not None:
        key = f"({parallel_state.get_pipeline_model_parallel_rank()}, {parallel_state.get_tensor_model_parallel_rank()})"
        state["rng_state"] = {key: rng_state}
    raw = {key: value.copy() if isinstance(value, dict) else value for key, value in state.items()}
    handle_fp8_extra_state_case(state["model"])
    if args.swiglu:
        state["model"], optimizer_state = handle_swiglu_in_state_dict(modules[0], state["model"],
                                                                       state.get("optimizer"))
        if optimizer_state is not None:
            state["optimizer"] = optimizer_state
    if args.num_experts:
        state["model"] = handle_experts_in_state_dict(state["model"], args.num_experts)
    preprocess_state_dict_for_uneven_dtensor(state)
    return state, raw


def save_fsdp_dtensor(target: Path, chunks: list, optimizer, scheduler, args, *, iteration: int,
                      consumed_samples: int, rng_state) -> None:
    """Megatron-FSDP's checkpoint (``ckpt_format: fsdp_dtensor``): torch DCP of the DTensor state dict."""
    import torch.distributed.checkpoint as dcp

    state, _ = _fsdp_dtensor_state(chunks, optimizer, scheduler, args, iteration=iteration,
                                   consumed_samples=consumed_samples, rng_state=rng_state,
                                   with_optimizer=not args.no_save_optim, is_loading=False)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(target)))


def load_fsdp_dtensor(source: Path, chunks: list, optimizer, scheduler, args, *, with_optimizer: bool,
                      with_rng: bool, restore_rng) -> tuple[int, int]:
    """Load a ``fsdp_dtensor`` checkpoint as Megatron-LM's ``_load_base_checkpoint`` does: DCP into the
    preprocessed state (a partial load), then the un-preprocessed model and optimizer state dicts into
    the Megatron-FSDP chunks and the optimizer. Returns (iteration, consumed samples)."""
    import torch.distributed.checkpoint as dcp
    from megatron.core import parallel_state
    from torch.distributed.checkpoint import default_planner

    from primus.backends.megatron.rng import rng_streams

    state, raw = _fsdp_dtensor_state(chunks, optimizer, scheduler, args, iteration=0, consumed_samples=0,
                                     rng_state=[rng_streams()] if with_rng else None, with_optimizer=with_optimizer,
                                     is_loading=True)
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(source)),
             planner=default_planner.DefaultLoadPlanner(allow_partial_load=True))
    for i, chunk in enumerate(chunks):
        chunk.load_state_dict(raw["model" if len(chunks) == 1 else f"model{i}"], strict=True)
    if with_optimizer:
        optimizer.load_state_dict(raw["optimizer"])
        scheduler.load_state_dict(state["opt_param_scheduler"])
    if with_rng:
        key = f"({parallel_state.get_pipeline_model_parallel_rank()}, {parallel_state.get_tensor_model_parallel_rank()})"
        restore_rng(state["rng_state"][key])
    return int(state["iteration"]), int(state["consumed_samples"])
