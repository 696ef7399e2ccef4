"""Engine-compatibility patches for TorchTitan: ``PATCHES``, each named, version-gated and conditional.

Each patch function says why it exists; its record says when it is needed. A run applies them
through one ``Patcher`` (``recipes/common.py``) and undoes them when it ends; every replacement
goes through ``Swaps`` so that the undo is exact. A run's TorchTitan was imported by its plan
already, so ``cpu_device_type`` reaches into the modules that hold the device names.
"""
from __future__ import annotations

import functools

import importlib.util
import os
import sys
import types
from collections.abc import Callable
from typing import Any

from packaging.specifiers import SpecifierSet

from primus.runtime.patches import ALWAYS, NO_GPU, PERMANENT, Condition, Patch, Swaps, Where, apply_for_process, \
    software, uses

ENGINE = "torchtitan"


def _cpu_device_module() -> types.ModuleType:
    """The subset of the ``torch.cuda`` API TorchTitan calls, answered for the host CPU."""
    module = types.ModuleType("primus_cpu_device")
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    module.set_device = lambda *a, **k: None
    module.device_count = lambda: 1
    module.current_device = lambda: 0
    module.is_available = lambda: True
    module.synchronize = lambda *a, **k: None
    module.get_device_name = lambda *a, **k: "cpu"
    module.get_device_properties = lambda *a, **k: types.SimpleNamespace(total_memory=total, name="cpu")
    module.reset_peak_memory_stats = lambda *a, **k: None
    module.empty_cache = lambda *a, **k: None
    module.memory_stats = lambda *a, **k: {}
    return module


def cpu_device_type(swap: Swaps = PERMANENT) -> None:
    """torchtitan.tools.utils computes ``device_type = ... or "cuda"`` at import, so a
    CPU-only host gets "cuda" and ``torch.cuda.set_device`` fails. Point it at the CPU
    (the distributed backend then follows: cpu -> gloo), in every TorchTitan module that
    imported the names already (a plan imports TorchTitan before any patch applies)."""
    import torchtitan.tools.utils as utils

    old_type, old_module = utils.device_type, utils.device_module
    if old_type == "cpu":
        return
    cpu = _cpu_device_module()
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "torchtitan" or name.startswith("torchtitan.")):
            continue
        names = vars(module)
        if names.get("device_type") == old_type:
            swap.set(module, "device_type", "cpu")
        if names.get("device_module") is old_module:
            swap.set(module, "device_module", cpu)


class _Permissive:
    """Stands in for any triton attribute at import time (decorators, constexpr types)."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, key: str) -> "_Permissive":
        if key.startswith("__"):
            raise AttributeError(key)
        return _Permissive(f"{self._name}.{key}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs and not isinstance(args[0], _Permissive):
            return args[0]  # bare decorator: @triton.jit
        return _Permissive(f"{self._name}()")

    def __getitem__(self, key) -> "_Permissive":
        return _Permissive(f"{self._name}[]")


def _stub_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__getattr__ = lambda key: _Permissive(f"{name}.{key}") if not key.startswith("__") else None
    module.__version__ = "0.0.0+primus-import-stub"
    return module


def triton_import_stub(swap: Swaps = PERMANENT) -> None:
    """torchtitan 0.3.0 imports triton unconditionally (distributed/minimal_async_ep/kernels.py)
    even for dense models; triton has no CPU wheel worth installing (~900 MB). Its kernels never
    launch on CPU, so an import-time stand-in is enough. torch's own optional ``import triton``
    checks run first and settle on "no triton"; the stand-in is removed right afterwards."""
    import torch._dynamo  # noqa: F401  (caches has_triton() = False before the stub exists)
    import torch._inductor.codecache  # noqa: F401

    triton, language = _stub_module("triton"), _stub_module("triton.language")
    triton.language = language
    sys.modules["triton"], sys.modules["triton.language"] = triton, language
    try:
        import torchtitan.distributed.minimal_async_ep  # noqa: F401
    finally:
        del sys.modules["triton"], sys.modules["triton.language"]


def set_timeout_alias(swap: Swaps = PERMANENT) -> None:
    """torchtitan 0.3.0 calls ``torch.distributed.set_timeout``, public only from torch 2.14;
    torch 2.13 has the same function as ``distributed_c10d._set_pg_timeout``."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _set_pg_timeout

    swap.set(dist, "set_timeout", _set_pg_timeout)


def gloo_sum_reduction(swap: Swaps = PERMANENT) -> None:
    """TorchTitan sets FSDP's gradient divide factor to 1.0 (it normalises by the global token
    count itself), so FSDP2 reduce-scatters with ``ReduceOp.PREMUL_SUM(1.0)``, which gloo
    rejects. Forcing plain SUM is numerically identical for a factor of 1."""
    import torchtitan.distributed.fsdp as fsdp
    from torch.distributed.fsdp import FSDPModule

    original = fsdp.disable_fsdp_gradient_division
    if getattr(original, "_primus_patched", False):
        return

    def disable_division_with_sum(model) -> None:
        original(model)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)

    disable_division_with_sum._primus_patched = True
    swap.set(fsdp, "disable_fsdp_gradient_division", disable_division_with_sum)


def sharded_init_on_cpu(swap: Swaps = PERMANENT) -> None:
    """On a CPU device mesh DTensor has no RNG tracker (torch ``distributed/tensor/_random.py``:
    ``is_rng_supported_mesh`` is False because ``torch.cpu`` has no ``set_rng_state``; the only
    sign is a warning). TorchTitan's ``Module._init_param`` then runs each initialiser on every
    rank's *local* shard with the same seed, so the shards of every FSDP/TP/EP-sharded parameter
    come out identical across ranks (expert i == expert i+E/2, duplicated router rows, repeated
    FSDP halves). Initialise the full tensor instead (every rank draws the same stream, no
    communication) and keep this rank's slice: the result equals the 1-rank initialisation."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor
    from torchtitan.models.common.param_init import skip_param_init
    from torchtitan.protocols.module import Module

    original = Module._init_param
    if getattr(original, "_primus_patched", False):
        return

    def init_full_then_slice(self, name: str, param) -> None:
        initialiser = (self._param_init or {}).get(name)
        if (not isinstance(param, DTensor) or param.device_mesh.device_type != "cpu"
                or initialiser is None or initialiser is skip_param_init):
            return original(self, name, param)
        full = torch.empty(param.shape, dtype=param.dtype, device="cpu")
        initialiser(full)
        local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
        with torch.no_grad():
            param.to_local().copy_(local)

    init_full_then_slice._primus_patched = True
    swap.set(Module, "_init_param", init_full_then_slice)


PRESPLIT_KEYWORDS = ("arg_mbs", "kwarg_mbs", "target_mbs")


def pipeline_presplit_microbatches(swap: Swaps = PERMANENT) -> None:
    """TorchTitan 0.3.0 hands its pipeline schedule microbatches it has already split
    (``schedule.step(arg_mbs=..., kwarg_mbs=..., target_mbs=...)``), an API of newer torch;
    torch 2.13's ``step(*args, **kwargs)`` takes those lists for model inputs and fails
    ("Expecting 4 arg_mbs but got 1", then ``Decoder.forward() got an unexpected keyword
    argument 'arg_mbs'``). torch 2.13 already runs pre-split microbatches in
    ``_step_microbatches``; route such calls there, with the bookkeeping ``step`` does."""
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti, PipelineScheduleSingle

    for schedule_class in (PipelineScheduleSingle, PipelineScheduleMulti):
        original = schedule_class.step
        if getattr(original, "_primus_patched", False):
            continue

        def step(self, *args, _whole_batch_step=original, **kwargs):
            if not any(key in kwargs for key in PRESPLIT_KEYWORDS):
                return _whole_batch_step(self, *args, **kwargs)
            microbatches = [kwargs.pop(key, None) for key in PRESPLIT_KEYWORDS]
            losses, loss_kwargs = kwargs.pop("losses", None), kwargs.pop("loss_kwargs", None)
            return_outputs = kwargs.pop("return_outputs", True)
            if args or kwargs:
                raise TypeError(f"pre-split pipeline step takes no other inputs, got {sorted(kwargs) or 'args'}")
            stages = getattr(self, "_stages", None) or [self._stage]
            for stage in stages:
                stage.has_backward = self._has_backward
                stage.clear_runtime_states()
            self._step_microbatches(*microbatches, losses, return_outputs, loss_kwargs=loss_kwargs)
            last = [stage for stage in stages if stage.is_last]
            return self._merge_outputs(last[0].output_chunks) if last and return_outputs else None

        step._primus_patched = True
        swap.set(schedule_class, "step", step)


def _torch_step_lacks_presplit() -> bool:
    import inspect

    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    return "arg_mbs" not in inspect.signature(PipelineScheduleSingle.step).parameters


def peak_flops_from_primus_table(swap: Swaps = PERMANENT) -> None:
    """torchtitan 0.3.0's ``get_peak_flops`` (called by its Trainer and MetricsProcessor) runs
    ``lspci`` (absent on most containers: "Error running lspci") and, for any name it does not
    know (CPU, MI250, ...), warns "Peak flops undefined ..., fallback to A100" and uses A100's
    peak. Primus computes MFU itself, the same way for every backend (``primus.plan.devices``),
    so TorchTitan's look-up answers from that table, silently; unknown is +inf (its own MFU,
    unused by Primus, reads 0 instead of a number against the wrong device)."""
    import torchtitan.tools.utils as utils

    from primus.plan.devices import peak_tflops

    def primus_peak_flops(device_name: str) -> float:
        peak = peak_tflops(device_name)
        return peak * 1e12 if peak else float("inf")

    swap.set(utils, "get_peak_flops", primus_peak_flops)


def checkpoint_on_transient_group(swap: Swaps = PERMANENT) -> None:
    """TorchTitan's synchronous checkpoint save/load calls ``dcp.save``/``dcp.load`` on the default
    process group. On a CPU host (gloo) with more than one intra-op thread, the plan gathers leave
    an OpenMP thread pool in each gloo worker thread that copies them, and libgomp then throttles
    every OpenMP worker's spin-wait for the rest of the run: steps after the first checkpoint took
    ~2x as long (tiny demo, 2 cores). Each save/load now runs on its own gloo group, destroyed
    right after, which takes the pools with it (root cause: ``primus/backends/dcp_group.py``).
    Async modes keep the group TorchTitan gives them."""
    import torchtitan.components.checkpointer.dcp as checkpointer

    from primus.backends.dcp_group import DCPOnTransientGroup

    if not isinstance(checkpointer.dcp, DCPOnTransientGroup):
        swap.set(checkpointer, "dcp", DCPOnTransientGroup(checkpointer.dcp))


COMPILING_AT_IMPORT = frozenset({"torchtitan.models.common.attention", "torchtitan.models.common.vision_encoder"})


def compile_on_first_call(swap: Swaps = PERMANENT) -> None:
    """torchtitan 0.3.0 calls ``torch.compile`` when ``models/common/attention.py`` is imported (the
    ``FlexAttention`` class body compiles ``flex_attention`` with Inductor options; ``create_block_mask``,
    also in ``vision_encoder.py``): each call imports Inductor's ``compile_fx``, about 1 s of CPU in every
    process that imports TorchTitan (the launcher planning a run, each rank), though a run on SDPA never
    calls them. They compile on their first call instead, with the same arguments
    (``primus.runtime.lazy_compile``). It acts on TorchTitan's first import, so the adapter installs it
    before importing TorchTitan; a run's ``Patcher`` finds it in place (the finder is inert afterwards)."""
    from primus.runtime.lazy_compile import install_deferred_compile

    install_deferred_compile(COMPILING_AT_IMPORT, COMPILE_ON_FIRST_CALL)


class _TimeWithoutSleep:
    """``torchtitan.trainer``'s view of the ``time`` module: everything but ``sleep``, which returns at once."""

    def __init__(self, module: types.ModuleType):
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        import logging

        logging.getLogger("primus.patches").debug("TorchTitan's %ss end-of-training sleep skipped: the ranks meet "
                                                  "at a barrier instead (end_of_training_barrier)", seconds)


def end_of_training_barrier(swap: Swaps = PERMANENT) -> None:
    """torchtitan 0.3.0's ``Trainer.train`` ends with ``time.sleep(2)`` on rank 0 ("Sleeping 2 seconds for
    other ranks to complete"), the only ``sleep`` in ``torchtitan/trainer.py``: every run waits 2 s, a
    one-rank run too, for ranks that are done or do not exist. What it approximates is a barrier: rank 0
    does not go on before the others finished training. So ``train`` ends with ``dist.barrier()`` on every
    rank (none with one rank: nothing to wait for) and the sleep returns at once. The job store is
    torchrun's agent's, or the in-process rank's own, so no rank leaves peers without a store. Applied on
    hosts without a GPU (gloo), where short runs (tests, the demo) are what the 2 s weighs on and where the
    barrier is tested; a GPU run keeps TorchTitan's own ending."""
    import torch.distributed as dist
    import torchtitan.trainer as trainer

    original = trainer.Trainer.train
    if getattr(original, "_primus_patched", False):
        return

    @functools.wraps(original)
    def train_then_barrier(self) -> None:
        original(self)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()

    train_then_barrier._primus_patched = True
    swap.set(trainer.Trainer, "train", train_then_barrier)
    swap.set(trainer, "time", _TimeWithoutSleep(trainer.time))


def no_download_count_ping(swap: Swaps = PERMANENT) -> None:
    """``datasets.load_dataset`` of local files through a packaged builder (Primus's ``jsonl`` and ``text``
    datasets: ``load_dataset("json", data_files=...)``) first sends a HEAD request to S3 to count a download
    of the builder's script (``datasets/load.py: increase_load_count``, timeout 3 s), unless
    ``HF_UPDATE_DOWNLOAD_COUNTS`` is off: on a host without a network the request fails at once, with DNS
    but no route a rank waits up to 3 s for it. The files are local; nothing is downloaded, so the ping is
    not made. A user who sets ``HF_UPDATE_DOWNLOAD_COUNTS`` keeps their setting (the record's condition)."""
    import datasets.config

    swap.set(datasets.config, "HF_UPDATE_DOWNLOAD_COUNTS", False)


def _triton_missing() -> bool:
    return importlib.util.find_spec("triton") is None


def _torch_lacks_set_timeout() -> bool:
    import torch.distributed as dist

    return not hasattr(dist, "set_timeout")


def _torch_cpu_lacks_rng_state() -> bool:
    import torch

    return not hasattr(torch.cpu, "set_rng_state")


# --- TorchTitan's transformers modeling backend (Llama 4) -------------------------------------------------
# Applied only when a model is built on that backend (``apply_hf_backend_patches``, from ``llama4.py`` and the
# adapter's run): importing it imports transformers, which other TorchTitan runs do not need.


def _hf_backend_model():
    from torchtitan.experiments.transformers_modeling_backend.model import HFTransformerModel

    return HFTransformerModel


def _full_then_local(param, fill: Callable) -> None:
    """``fill`` a full-size tensor and copy this rank's part into ``param`` (plain or DTensor): the same values
    on any number of ranks (see ``sharded_init_on_cpu``)."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    local = param.to_local() if isinstance(param, DTensor) else param
    full = torch.empty(param.shape, dtype=param.dtype, device=local.device)
    fill(full)
    if isinstance(param, DTensor):
        full = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
    with torch.no_grad():
        local.copy_(full)


def hf_backend_feed_forward_init(swap: Swaps = PERMANENT) -> None:
    """The transformers backend's init (``HFTransformerModel._patch_hf_llama_like``) tags each decoder
    layer's ``mlp`` with its ``layer_idx`` and then requires it on every MLP module; Llama 4 names the block
    ``feed_forward`` (its shared expert is another ``Llama4TextMLP``), so ``init_states`` fails with "does
    not have a layer_idx attribute". And for Llama 4's MoE the init is wrong where it runs: the router
    (``Llama4Router``, not a ``*TopKRouter``) is never initialised (``to_empty`` memory), and
    ``Llama4PreTrainedModel._init_weights`` redraws the experts from N(0, initializer_range), which the
    backend sets to 1.0 (its embedding std). Tag ``feed_forward`` like ``mlp``; after the backend's init,
    draw the router and experts as TorchTitan's own llama4 did (43e52fd: router depth-scaled, expert w1
    0.02, w2/w3 depth-scaled; depth std 0.02 / sqrt(2 (layer + 1)))."""
    import torch.nn as nn

    model_cls = _hf_backend_model()
    original = model_cls.init_states
    if getattr(original, "_primus_patched", False):
        return

    def init_states(self, *args, **kwargs):
        layers = list(self.layers.values()) if hasattr(self.layers, "values") else list(self.layers)
        for layer in layers:
            block = getattr(layer, "feed_forward", None)
            if block is not None and hasattr(layer, "layer_idx"):
                block.layer_idx = layer.layer_idx
                for name in ("shared_expert", "shared_experts"):
                    if getattr(block, name, None) is not None:
                        getattr(block, name).layer_idx = layer.layer_idx
        original(self, *args, **kwargs)
        for layer in layers:
            block = getattr(layer, "feed_forward", None)
            router, experts = getattr(block, "router", None), getattr(block, "experts", None)
            if router is None or experts is None or not hasattr(experts, "gate_up_proj"):
                continue
            depth = 0.02 / (2 * (layer.layer_idx + 1)) ** 0.5
            width = experts.gate_up_proj.shape[-1] // 2  # [E, dim, 2 * hidden]: gate | up

            def gate_up(full, depth=depth, width=width):
                nn.init.trunc_normal_(full[..., :width], std=0.02)
                nn.init.trunc_normal_(full[..., width:], std=depth)

            _full_then_local(router.weight, lambda full, depth=depth: nn.init.trunc_normal_(full, std=depth))
            _full_then_local(experts.gate_up_proj, gate_up)
            _full_then_local(experts.down_proj, lambda full, depth=depth: nn.init.trunc_normal_(full, std=depth))

    init_states._primus_patched = True
    swap.set(model_cls, "init_states", init_states)


def hf_backend_rope_buffers(swap: Swaps = PERMANENT) -> None:
    """The backend recomputes each rotary module's ``inv_freq`` after ``to_empty`` only where the module keeps
    a ``rope_init_fn``; ``Llama4TextRotaryEmbedding`` (transformers 5.18) picks it in ``__init__`` without
    keeping it, so ``inv_freq`` stays zero and every RoPE layer silently runs without positions. Recompute it
    as that ``__init__`` does (default: ``compute_default_rope_parameters``, else ``ROPE_INIT_FUNCTIONS``)."""
    import torch

    model_cls = _hf_backend_model()
    original = model_cls.init_states
    if getattr(original, "_primus_rope_patched", False):
        return

    def init_states(self, *args, **kwargs):
        original(self, *args, **kwargs)
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        for module in self.model.modules():
            if getattr(module, "rope_init_fn", None) is not None or not hasattr(module, "inv_freq"):
                continue
            rope_type = getattr(module, "rope_type", None)
            if rope_type == "default" and hasattr(module, "compute_default_rope_parameters"):
                init_fn = module.compute_default_rope_parameters
            elif rope_type in ROPE_INIT_FUNCTIONS:
                init_fn = ROPE_INIT_FUNCTIONS[rope_type]
            else:
                continue
            device = module.inv_freq.device
            inv_freq, scaling = init_fn(module.config, device)
            with torch.no_grad():
                module.inv_freq.copy_(inv_freq.to(device=device, dtype=module.inv_freq.dtype))
                if hasattr(module, "original_inv_freq"):
                    module.original_inv_freq.copy_(module.inv_freq)
            module.attention_scaling = scaling

    init_states._primus_patched = getattr(original, "_primus_patched", False)
    init_states._primus_rope_patched = True
    swap.set(model_cls, "init_states", init_states)


def hf_backend_chunked_attention_masks(swap: Swaps = PERMANENT) -> None:
    """The backend builds one causal flex ``BlockMask`` and hands it to the HF model as its attention mask;
    ``Llama4TextModel`` then uses that one mask for every layer, so its chunked-attention layers (the RoPE
    layers: a token sees only its own ``attention_chunk_size`` chunk) attend across chunks once
    ``seq_len`` exceeds the chunk. HF takes a ``{layer_type: mask}`` mapping as well: give the chunked
    layers the same mask AND ``q // chunk == kv // chunk`` (transformers' chunked_causal_mask_function)."""
    model_cls = _hf_backend_model()
    original = model_cls.get_attention_masks
    if getattr(original, "_primus_patched", False):
        return

    def get_attention_masks(self, positions):
        masks = original(self, positions)
        config = self.model.config
        chunk = getattr(config, "attention_chunk_size", None)
        if not chunk or "chunked_attention" not in (getattr(config, "layer_types", None) or ()):
            return masks
        from torch.nn.attention.flex_attention import BlockMask, and_masks
        from torchtitan.distributed.utils import is_in_batch_invariant_mode
        from torchtitan.models.common.attention import create_attention_mask

        if not isinstance(masks, BlockMask):
            return masks

        def same_chunk(b, h, q_idx, kv_idx):
            return (q_idx // chunk) == (kv_idx // chunk)

        batch, seq_len = positions.shape
        chunked = create_attention_mask(and_masks(masks.mask_mod, same_chunk), batch, None, seq_len, seq_len,
                                        device=positions.device, BLOCK_SIZE=128,
                                        separate_full_blocks=not is_in_batch_invariant_mode())
        return {"full_attention": masks, "chunked_attention": chunked}

    get_attention_masks._primus_patched = True
    swap.set(model_cls, "get_attention_masks", get_attention_masks)


def hf_backend_sdpa_on_cpu(swap: Swaps = PERMANENT) -> None:
    """The backend routes every attention through FlexAttention (``flex_torchtitan``), which has no CPU
    backward in torch 2.13 ("FlexAttention does not support backward on CPU"). On CPU the same masks are
    applied by SDPA instead: the BlockMask's ``mask_mod`` materialised as a dense boolean mask."""
    import torch.nn.functional as F
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import AttentionInterface

    import torchtitan.experiments.transformers_modeling_backend.model as backend

    if getattr(backend._flex_attention_torchtitan, "_primus_patched", False):
        return

    def sdpa_with_flex_masks(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        from torch.nn.attention.flex_attention import BlockMask, create_mask

        if attention_mask is not None and not isinstance(attention_mask, BlockMask):
            return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                          dropout=dropout, **kwargs)
        gqa = query.shape[1] != key.shape[1]
        if attention_mask is None:  # the backend's intent: causal (it never means full attention)
            out = F.scaled_dot_product_attention(query, key, value, is_causal=True, dropout_p=dropout,
                                                 scale=scaling, enable_gqa=gqa)
        else:
            mask = create_mask(attention_mask.mask_mod, query.shape[0], None, query.shape[2], key.shape[2],
                               device=query.device)
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout,
                                                 scale=scaling, enable_gqa=gqa)
        return out.transpose(1, 2).contiguous(), None

    sdpa_with_flex_masks._primus_patched = True
    swap.set(backend, "_flex_attention_torchtitan", sdpa_with_flex_masks)
    swap.set_item(AttentionInterface._global_mapping, backend._ATTN_IMPLEMENTATION, sdpa_with_flex_masks)


def hf_backend_feed_forward_sharding(swap: Swaps = PERMANENT) -> None:
    """The backend's sharding pass (``hf_sharding._set_layer_sharding_configs``) reads each dense layer's
    ``layer.mlp``; Llama 4's decoder layer has ``feed_forward`` (a ``Llama4TextMLP`` or, in MoE layers,
    transformers' ``Llama4TextMoe``, which the backend does not swap), so ``parallelize`` fails with
    "'Llama4TextDecoderLayer' object has no attribute 'mlp'". A dense ``feed_forward`` gets the MLP's
    configs (it has gate/up/down_proj); an MoE one is replicated (no TP: Primus refuses TP/EP for these
    models), which FSDP then shards like any other layer state."""
    import torchtitan.experiments.transformers_modeling_backend.hf_sharding as sharding

    original = sharding._set_layer_sharding_configs
    if getattr(original, "_primus_patched", False):
        return

    def set_layer_sharding_configs(layer, *, enable_sp: bool) -> None:
        block = getattr(layer, "feed_forward", None)
        if block is None or hasattr(layer, "mlp"):
            return original(layer, enable_sp=enable_sp)
        if hasattr(block, "gate_proj"):  # dense: the MLP rules, read through a plain attribute
            object.__setattr__(layer, "mlp", block)
            try:
                return original(layer, enable_sp=enable_sp)
            finally:
                del layer.__dict__["mlp"]
        flag = getattr(layer, "moe_enabled", None)
        layer.moe_enabled = True  # skips the dense-MLP rules
        try:
            original(layer, enable_sp=enable_sp)
        finally:
            layer.moe_enabled = flag
        for module in block.modules():
            if next(module.parameters(recurse=False), None) is not None or \
                    next(module.buffers(recurse=False), None) is not None:
                module._sharding_config = sharding._replicate_config(module)

    set_layer_sharding_configs._primus_patched = True
    swap.set(sharding, "_set_layer_sharding_configs", set_layer_sharding_configs)


# --- float8 training (``float8.py``): applied only when a model is converted (importing the converter
# imports torchao, which other TorchTitan runs do not need).


def float8_on_cpu(swap: Swaps = PERMANENT) -> None:
    """TorchTitan 0.3.0's ``Float8LinearConverter`` admits only NVIDIA SM 8.9+ or AMD gfx942+ GPUs
    (``has_cuda_capability(8, 9) or has_rocm_capability(9, 4)``) or ``emulate``, because torchao's
    float8 GEMM is ``torch._scaled_mm``; on a CPU host torch 2.13's ``_scaled_mm`` has float8 kernels
    (tensorwise and rowwise scales), so the converter's hardware check answers yes there. Emulation is
    not the answer: with ``emulate`` the converter builds torchao's tensorwise config whatever the recipe."""
    import torchtitan.components.quantization.float8 as float8

    from primus.backends.torchtitan.float8 import capability_gate_open

    original = float8.Float8LinearConverter.__init__
    if getattr(original, "_primus_patched", False):
        return

    def init_on_cpu(self, config) -> None:
        with capability_gate_open(float8):
            original(self, config)

    init_on_cpu._primus_patched = True
    swap.set(float8.Float8LinearConverter, "__init__", init_on_cpu)


def llama4_moe_float8_add(swap: Swaps = PERMANENT) -> None:
    """transformers' ``Llama4TextMoe.forward`` adds the routed experts' output into the shared expert's in
    place (``out.add_``). With float8 the shared expert's ``down_proj`` is torchao's ``Float8Linear``, whose
    output is a view made inside its autograd Function (``matmul_with_hp_or_float8_args`` reshapes it), and
    autograd refuses an in-place change of such a view ("Output 0 of matmul_with_hp_or_float8_args is a view
    and is being modified inplace"). The same forward with the sum out of place: the same numbers."""
    from transformers.models.llama4.modeling_llama4 import Llama4TextMoe

    if getattr(Llama4TextMoe.forward, "_primus_patched", False):
        return

    def forward(self, hidden_states):  # transformers 5.18.0's body, but the last addition
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        router_scores, router_logits = self.router(hidden_states)
        routed_in = hidden_states.repeat(router_scores.shape[1], 1)
        routed_in = routed_in * router_scores.transpose(0, 1).reshape(-1, 1)
        routed_out = self.experts(routed_in)
        out = self.shared_expert(hidden_states)
        out = out + routed_out.reshape(router_scores.shape[1], -1, routed_out.shape[-1]).sum(dim=0)
        return out, router_logits

    forward._primus_patched = True
    swap.set(Llama4TextMoe, "forward", forward)


def _cpu_float8_gemm() -> bool:
    from primus.backends.torchtitan.float8 import cpu_float8_gemm

    return cpu_float8_gemm()


TITAN = SpecifierSet(">=0.3,<0.4")
TORCH_BEFORE_2_14 = SpecifierSet("<2.14")
DATASETS_4 = SpecifierSet(">=4,<5")  # increase_load_count as read in 4.7.0 (also in 2.x and 3.x)
TRANSFORMERS_5_18 = SpecifierSet(">=5.18,<5.19")  # the pinned one, whose Llama4TextMoe.forward the patch copies
TRITON_MISSING = Condition("triton is not installed (a CPU torch; CUDA/ROCm torch brings it)",
                           lambda where: not where.assumed and _triton_missing())
COUNTS_UNSET = software("HF_UPDATE_DOWNLOAD_COUNTS is not set", lambda: "HF_UPDATE_DOWNLOAD_COUNTS" not in os.environ)
LLAMA4 = uses("llama4", "the run builds Llama 4 on TorchTitan's transformers backend")
FLOAT8 = uses("float8", "the run converts Linear layers to float8")

COMPILE_ON_FIRST_CALL = Patch("compile_on_first_call", "attention.py torch.compiles FlexAttention at import, which "
                              "imports Inductor (about 1 s of CPU per process)", ENGINE, TITAN, NO_GPU,
                              compile_on_first_call)

PATCHES = [
    COMPILE_ON_FIRST_CALL,
    Patch("cpu_device_type", "TorchTitan picks device 'cuda' at import even without CUDA",
          ENGINE, TITAN, NO_GPU, cpu_device_type),
    Patch("triton_import_stub", "torchtitan 0.3.0 imports triton unconditionally; a CPU torch has none",
          ENGINE, TITAN, TRITON_MISSING, triton_import_stub),
    Patch("set_timeout_alias", "torchtitan 0.3.0 calls torch.distributed.set_timeout, public from torch 2.14",
          "torch", TORCH_BEFORE_2_14, software("torch.distributed lacks set_timeout", _torch_lacks_set_timeout),
          set_timeout_alias),
    Patch("gloo_sum_reduction", "FSDP2 reduce-scatters with PREMUL_SUM, which gloo rejects",
          ENGINE, TITAN, NO_GPU, gloo_sum_reduction),
    Patch("sharded_init_on_cpu", "DTensor has no CPU RNG: every rank's shard would be initialised alike",
          ENGINE, TITAN, NO_GPU & software("torch.cpu lacks set_rng_state", _torch_cpu_lacks_rng_state),
          sharded_init_on_cpu),
    Patch("pipeline_presplit_microbatches", "torchtitan 0.3.0 passes pre-split microbatches this torch's "
          "pipeline schedules do not take", ENGINE, TITAN,
          software("torch's PipelineSchedule.step lacks arg_mbs", _torch_step_lacks_presplit),
          pipeline_presplit_microbatches),
    Patch("peak_flops_from_primus_table", "get_peak_flops runs lspci and falls back to A100's peak for "
          "devices it does not know", ENGINE, TITAN, ALWAYS, peak_flops_from_primus_table),
    Patch("checkpoint_on_transient_group", "DCP on gloo's default group leaves OpenMP pools that slow "
          "every later step", ENGINE, TITAN, NO_GPU, checkpoint_on_transient_group),
    Patch("end_of_training_barrier", "Trainer.train sleeps 2 s on rank 0 at its end, one-rank runs too, "
          "where a barrier is meant", ENGINE, TITAN, NO_GPU, end_of_training_barrier),
    Patch("no_download_count_ping", "loading local jsonl/text files pings S3 to count a download (up to 3 s "
          "without a route)", "datasets", DATASETS_4, COUNTS_UNSET, no_download_count_ping),
    Patch("hf_backend_feed_forward_sharding", "the transformers backend's sharding reads layer.mlp; Llama 4 "
          "has feed_forward", ENGINE, TITAN, LLAMA4, hf_backend_feed_forward_sharding),
    Patch("hf_backend_feed_forward_init", "the transformers backend's init misses Llama 4's feed_forward, "
          "router and experts", ENGINE, TITAN, LLAMA4, hf_backend_feed_forward_init),
    Patch("hf_backend_rope_buffers", "Llama 4's RoPE inv_freq stays zero after the backend's to_empty",
          ENGINE, TITAN, LLAMA4, hf_backend_rope_buffers),
    Patch("hf_backend_chunked_attention_masks", "one causal mask for every layer: Llama 4's chunked layers "
          "attend across chunks", ENGINE, TITAN, LLAMA4, hf_backend_chunked_attention_masks),
    Patch("hf_backend_sdpa_on_cpu", "FlexAttention has no CPU backward in torch 2.13",
          "torch", TORCH_BEFORE_2_14, LLAMA4 & NO_GPU, hf_backend_sdpa_on_cpu),
    Patch("float8_on_cpu", "the float8 converter admits only FP8 GPUs; this torch's CPU _scaled_mm has float8",
          ENGINE, TITAN, FLOAT8 & NO_GPU & software("torchao is installed and CPU _scaled_mm has float8 kernels",
                                                    _cpu_float8_gemm), float8_on_cpu),
    Patch("llama4_moe_float8_add", "Llama 4's MoE adds into the shared expert's output in place, which autograd "
          "refuses for a Float8Linear's output", "transformers", TRANSFORMERS_5_18, LLAMA4 & FLOAT8,
          llama4_moe_float8_add),
]


def run_uses(model_spec: Any) -> frozenset[str]:
    """What a run's model uses that has patches of its own (from TorchTitan's ``ModelSpec``: its model
    config, and its ``parallelize_fn`` where a transformers-backend model is swapped to float8)."""
    from primus.backends.torchtitan.float8 import Float8BeforeParallelize, converted_linears

    model_config = model_spec.model
    float8 = converted_linears(model_config) or isinstance(model_spec.parallelize_fn, Float8BeforeParallelize)
    found = {"float8"} if float8 else set()
    if getattr(model_config, "_primus_hf_config", None) is not None:
        found.add("llama4")
    return frozenset(found)


def params_uses(params: dict[str, Any]) -> frozenset[str]:
    """The same, read from an experiment's parameters without building anything (``primus patches EXP``)."""
    model = params.get("model") or {}
    converters = model.get("converters")
    found = {"float8"} if isinstance(converters, dict) and "float8" in converters else set()
    if model.get("name") == "llama4":
        found.add("llama4")
    return frozenset(found)


def apply_patches(uses: tuple[str, ...] = ()) -> list[str]:
    """Apply what is needed in this process for good (scripts and tests that build TorchTitan outside a run)."""
    return apply_for_process(PATCHES, Where.here(uses))


def apply_hf_backend_patches() -> list[str]:
    """``apply_patches`` for a Llama 4 model (TorchTitan's transformers backend)."""
    return apply_patches(("llama4",))
