"""megatron-core 0.16 bugs that stop PyTorch FSDP2 (``use_torch_fsdp2``), on any device.

Each is a named function with the upstream reason; ``patches.py`` lists them under the same
megatron-core version gate as every other patch. Where Megatron-LM has fixed one since, the
docstring names its pull request.
"""
from __future__ import annotations

from primus.runtime.patches import PERMANENT, Swaps


def patch_fsdp2_finish_grad_sync_signature(swap: Swaps = PERMANENT) -> None:
    """megatron-core's FSDP2 wrapper accepts ``finish_grad_sync(force_all_reduce=...)``.

    Why (megatron-core 0.16, any device): ``finalize_model_grads`` calls
    ``model_chunk.finish_grad_sync(force_all_reduce=...)`` on every chunk, but
    ``TorchFullyShardedDataParallel`` inherits ``_BaseDataParallel.finish_grad_sync(self)``, so the
    first FSDP2 training step fails with "unexpected keyword argument 'force_all_reduce'".
    Megatron-LM fixed it upstream (NVIDIA/Megatron-LM#4953) exactly so: FSDP2 takes the keyword and
    does what it did (its gradients are reduce-scattered by ``fully_shard`` in backward).
    """
    from megatron.core.distributed.torch_fully_sharded_data_parallel import TorchFullyShardedDataParallel

    if "finish_grad_sync" in vars(TorchFullyShardedDataParallel):
        return

    def finish_grad_sync(self, force_all_reduce=False):
        super(TorchFullyShardedDataParallel, self).finish_grad_sync()

    swap.set(TorchFullyShardedDataParallel, "finish_grad_sync", finish_grad_sync)


def patch_fsdp2_optimizer_param_identity(swap: Swaps = PERMANENT) -> None:
    """The optimizer's checkpoint finds FSDP2 parameters by the identity of their local shard again.

    Why (megatron-core 0.16 with torch >= 2.13, any device): the optimizer's ``sharded_state_dict``
    pairs each optimizer state with the model's ShardedTensor by ``id()``: the model side holds
    ``dtensor._local_tensor``, the optimizer side ``to_local_if_dtensor(param)``, which relied on
    ``DTensor.to_local()`` returning ``_local_tensor`` itself under ``no_grad``. Since PyTorch 2.13
    (pytorch/pytorch#166156) ``to_local()`` of a ``Parameter(DTensor)`` returns a fresh view, no id
    matches, and every FSDP2 checkpoint fails with "Param id 0 does not match any model sharded
    param". Here the checkpoint mapping gets the local shard itself, as before.
    """
    from megatron.core.dist_checkpointing import optimizer as optim_ckpt

    original = optim_ckpt.to_local_if_dtensor
    if getattr(original, "_primus_identity", False):
        return

    def to_local_if_dtensor(tensor):
        local = getattr(tensor, "_local_tensor", None)
        return local if local is not None else original(tensor)

    to_local_if_dtensor._primus_identity = True
    swap.set(optim_ckpt, "to_local_if_dtensor", to_local_if_dtensor)


def fsdp2_swiglu_slot(global_rows: int, local_rows: int, tp_size: int, tp_rank: int, dp_size: int, dp_rank: int,
                      key: str = "linear_fc1") -> int:
    """Where an FSDP2 rank's slice of the fused SwiGLU ``linear_fc1`` goes, in slices of ``local_rows``.

    The checkpoint's global tensor is W then V, each ordered by TP rank (the layout without FSDP);
    FSDP2 cuts one TP rank's [W; V] rows into ``dp_size`` slices, the first half of them in W.
    """
    half_rows = global_rows // tp_size // 2
    if half_rows % local_rows or dp_size != 2 * (half_rows // local_rows):
        raise ValueError(f"{key}: FSDP2 must shard linear_fc1 so that each data-parallel slice lies wholly "
                         "inside W or V of SwiGLU")
    per_half = half_rows // local_rows
    half, index = divmod(dp_rank, per_half)
    return half * tp_size * per_half + tp_rank * per_half + index


def patch_fsdp2_swiglu_checkpoint_layout(swap: Swaps = PERMANENT) -> None:
    """An FSDP2 model's fused SwiGLU ``linear_fc1`` is saved where its rows belong (upstream #5714).

    Why (megatron-core 0.16, any device): ``linear_fc1`` holds [W; V] (the two SwiGLU halves) and
    its sharded state dict splits each rank's rows into a W half and a V half. Under FSDP2 a rank
    holds a data-parallel slice of those rows, which lies wholly in W or in V, yet 0.16 still
    halves it: with DP 2, rank 0's "V" is the second half of W. An FSDP2 run resumes from its own
    checkpoint (the same mislabelling both ways) but any other layout (plain DDP, another DP size,
    an export) reads W and V scrambled. Megatron-LM fixed it in NVIDIA/Megatron-LM#5714 (2026-07);
    this is that fix: for an FSDP2 ``linear_fc1`` each DP slice is one ShardedTensor at its place
    in the TP-then-DP order of W, then V.
    """
    import contextvars

    import torch
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    from megatron.core.transformer import mlp

    if getattr(mlp.apply_swiglu_sharded_factory, "_primus_fsdp2", False):
        return
    original_factory, original_sharded_state_dict = mlp.apply_swiglu_sharded_factory, mlp.MLP.sharded_state_dict
    fsdp2_groups = contextvars.ContextVar("primus_fsdp2_swiglu_groups", default=None)

    def dp_sharded_factory(original_sh_ten, sharded_offsets, tp_group, dp_group):
        axis = len(sharded_offsets)  # the SwiGLU axis (0) after the prepended axes
        slot = fsdp2_swiglu_slot(original_sh_ten.global_shape[axis], original_sh_ten.local_shape[0],
                                 tp_group.size(), tp_group.rank(), dp_group.size(), dp_group.rank(),
                                 key=original_sh_ten.key)
        fragments = original_sh_ten.axis_fragmentations[axis]

        @torch.no_grad()
        def build(key, t, replica_id, flattened_range):
            return [ShardedTensor.from_rank_offsets(key, t, *sharded_offsets, (axis, slot, fragments),
                                                    replica_id=replica_id, prepend_axis_num=axis)]

        factory = original_factory(original_sh_ten, sharded_offsets)
        factory.build_fn = build
        return factory

    def apply_swiglu_sharded_factory(original_sh_ten, sharded_offsets, singleton_local_shards=False):
        groups = fsdp2_groups.get()
        if groups is None or singleton_local_shards:
            return original_factory(original_sh_ten, sharded_offsets, singleton_local_shards)
        return dp_sharded_factory(original_sh_ten, sharded_offsets, *groups)

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        from megatron.core import parallel_state
        from torch.distributed.tensor import DTensor

        groups = None
        if isinstance(getattr(self.linear_fc1, "weight", None), DTensor):
            dp_group = (metadata or {}).get("dp_cp_group") or \
                parallel_state.get_data_parallel_group(with_context_parallel=True)
            if dp_group.size() > 1:
                groups = (self.tp_group, dp_group)
        token = fsdp2_groups.set(groups)
        try:
            return original_sharded_state_dict(self, prefix, sharded_offsets, metadata)
        finally:
            fsdp2_groups.reset(token)

    apply_swiglu_sharded_factory._primus_fsdp2 = True
    swap.set(mlp, "apply_swiglu_sharded_factory", apply_swiglu_sharded_factory)
    swap.set(mlp.MLP, "sharded_state_dict", sharded_state_dict)

