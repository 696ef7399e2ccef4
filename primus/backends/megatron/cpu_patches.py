"""Compatibility patches for megatron-core: the CPU ones, then upstream bugs on every device.

megatron-core is written for GPUs: it passes ``device=torch.cuda.current_device()`` about 250
times, keeps its RNG streams in CUDA generators, builds optimizer/DDP scalars with
``device='cuda'`` and checks parameter types by their CUDA names. None of that is a bug on a GPU;
on a CPU-only torch (gloo, tests, laptops) each is a hard failure. Every patch below is one named
function with the upstream reason; ``patches.py`` lists them with the versions and the condition
under which a run applies them, and each replacement goes through ``Swaps`` so the run can undo it.
"""
from __future__ import annotations

import contextlib

from primus.runtime.patches import PERMANENT, Swaps


def patch_current_device(swap: Swaps = PERMANENT) -> None:
    """``torch.cuda.current_device()`` -> ``"cpu"``.

    Why: megatron-core allocates with ``device=torch.cuda.current_device()`` everywhere (RoPE
    ``inv_freq``, the global memory buffer, TP/PP communication buffers). On a CPU-only torch
    that call raises "Torch not compiled with CUDA enabled". torch accepts the string ``"cpu"``
    wherever a device is accepted, so returning it turns every such site into a CPU allocation.
    ``torch.cuda.synchronize`` becomes a no-op for the same reason (timers, schedules).
    """
    import torch

    swap.set(torch.cuda, "current_device", lambda: "cpu")
    swap.set(torch.cuda, "synchronize", lambda *args, **kwargs: None)


def patch_rng_tracker(swap: Swaps = PERMANENT) -> None:
    """``CudaRNGStatesTracker.add/fork`` keep their streams in CPU generators.

    Why: ``tensor_parallel.model_parallel_cuda_manual_seed`` registers the data-parallel and
    tensor-parallel RNG streams with ``torch.cuda.get_rng_state()``, and every TP layer's
    initialisation runs inside ``get_cuda_rng_tracker().fork()``, which swaps CUDA generator
    states. Without CUDA both raise. On CPU the same streams live in the CPU default generator,
    swapped in and out exactly as the CUDA ones are, so TP ranks still draw different weights.
    """
    import torch
    from megatron.core.tensor_parallel import random as mrandom

    def add(self, name, seed):
        self._is_initialized = True
        if seed in self.seeds_:
            raise Exception(f"seed {seed} already exists")
        self.seeds_.add(seed)
        if name in self.states_:
            raise Exception(f"rng state {name} already exists")
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name=mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):
        if name not in self.states_:
            raise Exception(f"rng state {name} is not added")
        outer = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)

    swap.set(mrandom.CudaRNGStatesTracker, "add", add)
    swap.set(mrandom.CudaRNGStatesTracker, "fork", fork)


def patch_recompute_rng(swap: Swaps = PERMANENT) -> None:
    """Activation recompute saves and restores "the CUDA RNG state" in the CPU generator.

    Why: ``tensor_parallel.checkpoint`` (``recompute_granularity: full`` and ``selective``) calls
    ``_get_cuda_rng_state()`` / ``_set_cuda_rng_state()`` around the recomputed forward so dropout
    draws the same masks twice; without CUDA both raise "Torch not compiled with CUDA enabled".
    On CPU the streams those functions stand for live in the CPU generator (see
    ``patch_rng_tracker``), so the same save/restore is done there.
    """
    import torch
    from megatron.core.tensor_parallel import random as mrandom

    swap.set(mrandom, "_get_cuda_rng_state", lambda *args, **kwargs: torch.get_rng_state())
    swap.set(mrandom, "_set_cuda_rng_state", lambda new_state, *args, **kwargs: torch.set_rng_state(new_state))


# What the shared TorchFunctionMode rewrites; each flag is switched on by its own patch.
_MODE_RULES = {"cuda_device": False, "cuda_type_names": False}
_MODE = {"entered": None}  # the mode while it is on the stack


def _install_cpu_mode(swap: Swaps) -> None:
    """Push one ``TorchFunctionMode`` that applies the enabled ``_MODE_RULES``; popped when ``swap`` is undone."""
    if _MODE["entered"] is not None:
        return
    import torch
    from torch.overrides import TorchFunctionMode

    def is_cuda(device) -> bool:
        return device is not None and str(device).startswith("cuda")

    class CudaOnCpuMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if _MODE_RULES["cuda_device"]:
                if func is torch.Tensor.cuda:
                    return args[0]
                if is_cuda(kwargs.get("device")):
                    kwargs = {**kwargs, "device": "cpu"}
                if func is torch.Tensor.to:
                    args = tuple("cpu" if isinstance(a, (str, torch.device)) and is_cuda(a) else a for a in args)
            if _MODE_RULES["cuda_type_names"] and func is torch.Tensor.type and len(args) == 1 and not kwargs:
                name = func(*args)
                return name if name.startswith("torch.cuda.") else name.replace("torch.", "torch.cuda.", 1)
            return func(*args, **kwargs)

    mode = CudaOnCpuMode()
    swap.enter(mode)  # on this (the main) thread's mode stack until the run ends
    swap.set_item(_MODE, "entered", mode)


def patch_cuda_device_arguments(swap: Swaps = PERMANENT) -> None:
    """Map ``device='cuda'`` to CPU and make ``Tensor.cuda()`` a no-op (via a TorchFunctionMode).

    Why: Megatron's optimizer, grad scaler, gradient clipping, DDP buffers and the pipeline
    schedules create small tensors with a literal ``device='cuda'`` (``clip_grads.py``,
    ``optimizer.py`` ``_scale_one``/``found_inf``, ``schedules.py`` ``total_num_tokens``) or call
    ``.cuda()`` on optimizer state when loading a checkpoint. These do not go through
    ``current_device()``; intercepting them at the torch-function level fixes every site
    without copying upstream code.
    """
    swap.set_item(_MODE_RULES, "cuda_device", True)
    _install_cpu_mode(swap)


def patch_param_type_checks(swap: Swaps = PERMANENT) -> None:
    """CPU tensors report CUDA type names to Megatron's ``x.type() == 'torch.cuda.*'`` checks.

    Why: ``clip_grads.clip_grad_by_total_norm_fp32`` asserts
    ``param.grad.type() == 'torch.cuda.FloatTensor'`` (so any ``clip_grad > 0`` fails on CPU),
    and ``Float16OptimizerWithFloat16Params`` / ``DistributedOptimizer`` sort parameters by the
    same CUDA type names (bf16 and ``use_distributed_optimizer`` raise ``TypeError`` on CPU).
    Only the argument-less ``Tensor.type()`` query is rewritten; conversions are untouched.
    """
    swap.set_item(_MODE_RULES, "cuda_type_names", True)
    _install_cpu_mode(swap)


def patch_moe_router_gemm_name(swap: Swaps = PERMANENT) -> None:
    """Define ``moe_utils.te_general_gemm`` (as None) when Transformer Engine is absent.

    Why: megatron-core 0.16 imports ``te_general_gemm`` inside ``try: ... except ImportError:
    HAVE_TE = False`` but ``RouterGatingLinearFunction`` tests ``te_general_gemm is not None``
    unguarded, so any MoE router with ``moe_router_dtype`` (fp32/fp64) raises NameError without
    Transformer Engine. None is exactly the "not available" value that code expects.
    """
    from megatron.core.transformer.moe import moe_utils

    if not moe_utils.HAVE_TE and not hasattr(moe_utils, "te_general_gemm"):
        swap.set(moe_utils, "te_general_gemm", None)


class _NoCudaStream:
    """Stands in for the alltoall dispatcher's class-level CUDA side stream on CPU (never used)."""


def patch_alltoall_dispatcher_without_cuda_streams(swap: Swaps = PERMANENT) -> None:
    """The alltoall token dispatcher's device-to-host step without CUDA streams.

    Why: ``MoEAlltoAllTokenDispatcher.__init__`` creates a class-wide ``torch.cuda.Stream()`` and
    ``_maybe_dtoh_and_synchronize`` copies the split sizes to the host on it, recording a CUDA
    event; on a CPU-only torch both raise. The copy also turns the split sizes into numpy arrays
    (``maybe_move_tensor_to_cpu(as_numpy=True)`` only converts CUDA tensors), and
    ``torch.distributed.all_to_all_single`` takes numpy arrays or lists but rejects the CPU
    tensors left otherwise ("incompatible function arguments"). On CPU the tensors already are
    on the host: convert the same attributes to numpy at the same point, with no stream or event.
    """
    import torch
    from megatron.core.transformer.moe import token_dispatcher

    dispatcher = token_dispatcher.MoEAlltoAllTokenDispatcher
    if dispatcher.cuda_dtoh_stream is None:
        swap.set(dispatcher, "cuda_dtoh_stream", _NoCudaStream())  # __init__ builds a torch.cuda.Stream() only when None

    def as_numpy(value):
        return value.numpy() if torch.is_tensor(value) else value

    def _maybe_dtoh_and_synchronize(self, point, tokens_per_expert=None):
        if not self.drop_and_pad and point == self.cuda_dtoh_point:
            self.input_splits = as_numpy(self.input_splits)
            self.output_splits = as_numpy(self.output_splits)
            self.output_splits_tp = as_numpy(self.output_splits_tp)
        return tokens_per_expert

    swap.set(dispatcher, "_maybe_dtoh_and_synchronize", _maybe_dtoh_and_synchronize)


def patch_cpu_expert_init_across_ep_ranks(swap: Swaps = PERMANENT) -> None:
    """With CPU initialisation, each expert-parallel rank draws the experts a one-rank run draws.

    Why: with ``use_cpu_initialization`` (always on CPU) megatron-core builds every weight as the
    full master tensor from the default generator and keeps this rank's slice
    (``_initialize_affine_weight_cpu``); experts skip the expert-parallel RNG stream the GPU path
    forks. Every EP rank reaches its local experts with the same generator state, so rank r's
    expert j equals rank 0's expert j: with EP=2 global expert E/2 + j == expert j, half the
    experts wasted (the same class of bug as DTensor's sharded init on CPU). Here each rank first
    draws (and drops) the experts of the ranks before it and afterwards those of the ranks after
    it, so every rank's experts - and everything built after them - are bit for bit the one-rank
    initialisation. TP shards need nothing: each TP rank draws the full master weight and slices it.
    """
    from megatron.core import parallel_state
    from megatron.core.transformer.moe import experts

    original = experts.SequentialMLP.__init__
    if getattr(original, "_primus_one_rank_init", False):
        return

    def __init__(self, num_local_experts, config, submodules, pg_collection=None):
        ep_group = pg_collection.ep if pg_collection is not None else parallel_state.get_expert_model_parallel_group()
        ep_size, ep_rank = ep_group.size(), ep_group.rank()
        if not (config.use_cpu_initialization and config.perform_initialization and ep_size > 1):
            return original(self, num_local_experts, config, submodules, pg_collection)

        def draw_and_drop(count):  # the experts of other ranks, built exactly as upstream builds them
            if count:
                original(experts.SequentialMLP.__new__(experts.SequentialMLP), count, config, submodules, pg_collection)

        draw_and_drop(ep_rank * num_local_experts)
        original(self, num_local_experts, config, submodules, pg_collection)
        draw_and_drop((ep_size - ep_rank - 1) * num_local_experts)

    __init__._primus_one_rank_init = True
    swap.set(experts.SequentialMLP, "__init__", __init__)


def patch_torch_fsdp2_cpu_mesh(swap: Swaps = PERMANENT) -> None:
    """megatron-core's FSDP2 wrapper builds its device mesh for the CPU when there is no CUDA.

    Why: ``TorchFullyShardedDataParallel.__init__`` calls ``DeviceMesh.from_group(group, "cuda")``,
    and PyTorch's ``fully_shard`` then places every shard on ``cuda`` (on a CPU-only torch: "Torch
    not compiled with CUDA enabled"). FSDP2 itself runs on CPU meshes over gloo; the same mesh
    with device type ``cpu`` keeps the data-parallel group and every sharding decision.
    """
    from megatron.core.distributed import torch_fully_sharded_data_parallel as fsdp2

    mesh_class = fsdp2.DeviceMesh
    if getattr(mesh_class, "_primus_cpu", False):
        return

    class CpuDeviceMesh:
        _primus_cpu = True

        @staticmethod
        def from_group(group, device_type, *args, **kwargs):
            return mesh_class.from_group(group, "cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    swap.set(fsdp2, "DeviceMesh", CpuDeviceMesh)


def patch_checkpoint_results_queue_by_fork(swap: Swaps = PERMANENT) -> None:
    """megatron-core's torch_dist writer reports its results through a forked multiprocessing Manager,
    not a spawned one.

    Why: ``filesystem_async._get_write_results_queue`` starts a Manager with the spawn method on a
    rank's first save. That fresh interpreter imports torch and torch.distributed.checkpoint to
    unpickle the first write results it is handed: about 4 s per rank on a CPU host, longer than
    a tiny run's training. A Manager forked from the rank has them already; megatron-core forks its
    writer processes the same way (``write_preloaded_data_multiproc``). One queue per process, as
    upstream keeps it.
    """
    import multiprocessing

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    queues = []

    def results_queue():
        if not queues:
            queues.append(multiprocessing.get_context("fork").Manager().Queue())
        return queues[0]

    swap.set(filesystem_async, "_get_write_results_queue", results_queue)


def patch_identity_reduce_for_single_rank_groups(swap: Swaps = PERMANENT) -> None:
    """A tensor-parallel all-reduce over a one-rank group returns its input outside autograd.Function.

    Why (megatron-core 0.16, any device): ``_ReduceFromModelParallelRegion`` returns its input
    as-is when the group has one rank, which autograd marks as a view of a custom Function. MoE
    experts with biases on SequentialMLP (``add_bias_linear: true``, e.g. gpt-oss) at expert
    TP = EP = 1 then fail in ``MLP.forward`` (``output += output_bias * per_token_scale``):
    "Output 0 of _ReduceFromModelParallelRegion is a view and is being modified inplace". For a
    one-rank group the Function is the identity both ways (backward returns grad_output), so
    returning the input directly is the same computation without the view marking.
    """
    from megatron.core.tensor_parallel import layers, mappings

    original = mappings.reduce_from_tensor_model_parallel_region
    if getattr(original, "_primus_identity", False):
        return

    def reduce_from_tensor_model_parallel_region(input_, group=None):
        if mappings.get_tensor_model_parallel_group_if_none(group).size() == 1:
            return input_
        return original(input_, group)

    reduce_from_tensor_model_parallel_region._primus_identity = True
    swap.set(mappings, "reduce_from_tensor_model_parallel_region", reduce_from_tensor_model_parallel_region)
    swap.set(layers, "reduce_from_tensor_model_parallel_region", reduce_from_tensor_model_parallel_region)


def patch_local_attention_mla_head_dims(swap: Swaps = PERMANENT) -> None:
    """megatron-core's local ``DotProductAttention`` takes MLA's ``k_channels``/``v_channels``.

    Why (megatron-core 0.16, any device without Transformer Engine): ``MLASelfAttention`` builds
    its core attention with ``k_channels=q_head_dim, v_channels=v_head_dim`` (Q/K and V heads
    differ in MLA), which only ``TEDotProductAttention`` accepts: the local spec's MLA fails with
    "DotProductAttention.__init__() got an unexpected keyword argument 'k_channels'". The local
    attention already reads every head width from its input tensors; only its output width
    (heads x kv_channels) and its default softmax scale (1/sqrt(kv_channels)) assume equal Q/K/V
    heads. Here they follow v_channels and k_channels, as Transformer Engine's attention does.
    """
    import math

    from megatron.core.transformer import dot_product_attention as dpa
    from megatron.core.utils import divide

    original = dpa.DotProductAttention.__init__
    if getattr(original, "_primus_mla", False):
        return

    def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                 softmax_scale=None, cp_comm_type=None, pg_collection=None, k_channels=None, v_channels=None):
        original(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=attention_dropout,
                 softmax_scale=softmax_scale, cp_comm_type=cp_comm_type, pg_collection=pg_collection)
        if v_channels is not None:
            self.hidden_size_per_partition = divide(v_channels * config.num_attention_heads, self.tp_group.size())
        if k_channels is not None and softmax_scale is None:
            self.softmax_scale = 1.0 / math.sqrt(k_channels)
            if config.apply_query_key_layer_scaling:
                self.softmax_scale /= self.layer_number

    __init__._primus_mla = True
    swap.set(dpa.DotProductAttention, "__init__", __init__)


def patch_torch_norm_sequence_parallel(swap: Swaps = PERMANENT) -> None:
    """megatron-core's torch norm (the local spec's norm without Apex/TE) under sequence parallelism.

    Why (megatron-core 0.16, any device without Transformer Engine or Apex): ``WrappedTorchNorm``
    asserts "sequence parallel not supported by torch LayerNorm", so TP + ``sequence_parallel``
    cannot build a model. A norm is per token, so on a sequence shard its forward is exact; what
    sequence parallelism needs is the reduction of the norm weights' gradients (each TP rank saw
    only its tokens), which megatron-core does itself in ``finalize_model_grads``
    (``_allreduce_non_tensor_model_parallel_grads``) for every parameter marked
    ``sequence_parallel`` - the mark Apex's and TE's norms set. Here the torch norm is built as
    before and its parameters get that mark; everything else is megatron-core's own path.
    """
    from megatron.core.transformer import torch_norm

    original = torch_norm.WrappedTorchNorm.__new__
    if getattr(original, "_primus_sp", False):
        return

    def __new__(cls, config, hidden_size, eps=1e-5, persist_layer_norm=False, zero_centered_gamma=False,
                normalization="LayerNorm"):
        if not config.sequence_parallel:
            return original(cls, config, hidden_size, eps, persist_layer_norm, zero_centered_gamma, normalization)
        import dataclasses

        norm = original(cls, dataclasses.replace(config, sequence_parallel=False), hidden_size, eps,
                        persist_layer_norm, zero_centered_gamma, normalization)
        for param in norm.parameters():
            param.sequence_parallel = True
        return norm

    __new__._primus_sp = True
    swap.set(torch_norm.WrappedTorchNorm, "__new__", __new__)


def patch_mla_without_transformer_engine(swap: Swaps = PERMANENT) -> None:
    """MLA's "is Transformer Engine here?" flag tells the truth when it is not installed.

    Why (megatron-core 0.16, any device without Transformer Engine): ``multi_latent_attention``
    sets ``HAVE_TE = True`` when ``megatron.core.extensions.transformer_engine`` imports, but that
    module imports fine without TE (it substitutes a MagicMock for ``transformer_engine``), so
    ``TELinear`` is a MagicMock and ``isinstance(self.linear_proj, TELinear)`` raises
    "isinstance() arg 2 must be a type" in every MLASelfAttention. The extension module's own
    ``HAVE_TE`` is right; MLA gets it and the "absent" values its except-branch would have set.
    """
    from megatron.core.extensions import transformer_engine as te_ext
    from megatron.core.transformer import multi_latent_attention as mla

    if not te_ext.HAVE_TE and mla.HAVE_TE:
        swap.set(mla, "HAVE_TE", False)
        for name in ("TEColumnParallelLinear", "TELinear", "Linear", "set_save_original_input"):
            swap.set(mla, name, None)


def patch_distrib_optimizer_legacy_load_with_torch_adam(swap: Swaps = PERMANENT) -> None:
    """The distributed optimizer's legacy ``distrib_optim.pt`` loads into torch's Adam.

    Why (megatron-core 0.16 without Transformer Engine / Apex, any device; still so in Megatron-LM
    main): ``load_parameter_state_from_dp_zero`` hands each parameter its ``param``, ``exp_avg`` and
    ``exp_avg_sq`` shards, and ``_set_main_param_and_optimizer_states`` copies every key of the
    optimizer's state from them; torch's Adam also keeps a per-parameter ``step`` there (TE's and
    Apex's fused Adam keep it in the param group), so resuming a ``ckpt_format: torch`` checkpoint
    with ``use_distributed_optimizer`` fails with KeyError 'step'. Here the keys the file holds are
    copied; ``step`` comes from the checkpoint's param groups, as for torch_dist.
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    original = DistributedOptimizer._set_main_param_and_optimizer_states
    if getattr(original, "_primus_torch_adam", False):
        return

    def _set_main_param_and_optimizer_states(self, model_param, tensors):
        if self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
            return original(self, model_param, tensors)
        group_index, group_order = self.model_param_group_index_map[model_param]
        main_param = self.optimizer.param_groups[group_index]["params"][group_order]
        for key, target in {"param": main_param, **self.optimizer.state[main_param]}.items():
            if key in tensors:
                target.copy_(tensors[key])

    _set_main_param_and_optimizer_states._primus_torch_adam = True
    swap.set(DistributedOptimizer, "_set_main_param_and_optimizer_states", _set_main_param_and_optimizer_states)
