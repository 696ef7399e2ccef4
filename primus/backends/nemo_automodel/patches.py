"""Engine-compatibility fixes for NeMo AutoModel 0.7.0: ``PATCHES``, each named, scoped, and tested.

AutoModel runs unmodified on CPU (measured: gloo, FSDP2, 2 ranks); what is fixed here is its
logging (keeping Primus's handlers and rank output intact around ``setup()``, one ``[TRAIN]``
line per step), its CUDA-only calls in the LLM recipe, its checkpoints on gloo, and the RNG a resumed
dataloader draws from (torchdata's, under AutoModel's resume). Each fix is a
context manager; its record wraps the recipe's ``setup()`` or training loop in it (or holds it for
the run), and the run's ``Patcher`` (``recipes/``) undoes them all when it ends.
``check_version`` says when the installed AutoModel is not the one they were written against.
``tap_flow_matching_step`` is the hook Primus needs inside a loop that offers none (``hooks.py``).
"""
from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any
from contextlib import AbstractContextManager, contextmanager

from packaging.specifiers import SpecifierSet

from primus.runtime.patches import ALWAYS, NO_GPU, PERMANENT, Patch, Swaps, uses

APPLIES_TO = ("0.7.0",)
ENGINE = "nemo_automodel"


def check_version(version: str, warn: Callable[[str], None]) -> None:
    if version not in APPLIES_TO:
        warn(f"nemo-automodel {version} is untested (validated: {', '.join(APPLIES_TO)}): its config checks "
             "and patches may be stale")


def tap_flow_matching_step(pipeline: Any, on_micro_batch: Callable[[Any, dict], None]) -> Callable[[], None]:
    """Call ``on_micro_batch(loss, batch)`` for every training micro-batch; returns the undo.

    Why: ``run_train_validation_loop`` (0.7.0) keeps each micro-batch's loss in a local variable
    and offers no callback; its ``flow_matching_pipeline.step`` returns it. The wrapper is an
    instance attribute of this recipe's pipeline only. Validation runs under ``no_grad`` and is
    not counted.
    """
    import torch

    original = pipeline.step

    def step(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if torch.is_grad_enabled():
            on_micro_batch(out[1], kwargs.get("batch", args[1] if len(args) > 1 else {}))
        return out

    pipeline.step = step
    return lambda: pipeline.__dict__.pop("step", None)


def _is_rank_filter(f: object) -> bool:
    return type(f).__name__ == "RankFilter" and type(f).__module__.startswith("nemo_automodel")


@contextmanager
def keep_primus_logging() -> Iterator[None]:
    """Undo what ``nemo_automodel.components.loggers.log_utils.setup_logging`` does to global logging.

    Why: ``TrainDiffusionRecipe.setup()`` (0.7.0) calls ``setup_logging()``, which replaces the
    formatter of every root handler (Primus's console/file format), sets the root level, and adds
    a ``RankFilter`` to every logger that, on the first record seen on a rank > 0, calls
    ``logging.disable(CRITICAL)``: all logging of that process, Primus's errors included, goes
    silent for good. Primus owns logging and rank filtering, so the state is restored on exit.
    """
    root = logging.getLogger()
    handlers = list(root.handlers)
    formatters = {h: h.formatter for h in handlers}
    level, disabled = root.level, logging.root.manager.disable
    try:
        yield
    finally:
        for handler in list(root.handlers):
            if handler not in formatters:
                root.removeHandler(handler)
        for handler, formatter in formatters.items():
            handler.setFormatter(formatter)
        root.setLevel(level)
        loggers = [root, *(lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger))]
        for filterer in [*loggers, *handlers]:
            for f in [f for f in filterer.filters if _is_rank_filter(f)]:
                filterer.removeFilter(f)
        logging.disable(disabled)


class _DropEngineTrainLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == "root" and str(record.msg).startswith("[TRAIN]"))


@contextmanager
def one_train_line() -> Iterator[None]:
    """Drop AutoModel's own ``[TRAIN] step=...`` log record while the training loop runs.

    Why: ``run_train_validation_loop`` (0.7.0) logs a ``[TRAIN]`` line on the root logger with a
    0-based step; Primus prints the canonical ``[TRAIN]`` line (1-based, same fields for every
    backend) from the StepReport, and two differently numbered lines per step mislead readers
    and log parsers. AutoModel's other messages pass through.
    """
    root, drop = logging.getLogger(), _DropEngineTrainLine()
    root.addFilter(drop)
    try:
        yield
    finally:
        root.removeFilter(drop)


@contextmanager
def checkpoint_on_transient_group() -> Iterator[None]:
    """Run AutoModel's checkpoint ``dcp.save``/``dcp.load`` on a transient gloo group (CPU hosts).

    Why: ``Checkpointer`` (0.7.0) calls DCP on the default process group unless given one. On
    gloo with more than one intra-op thread, the plan gathers leave an OpenMP thread pool in each
    gloo worker thread that copies them (measured: two extra pools after the first save of the
    tiny Wan), and libgomp then throttles every OpenMP worker's spin-wait for the rest of the run.
    Each save/load on its own group, destroyed right after, takes the pools with it (root cause
    and mechanism: ``primus/backends/dcp_group.py``). Scoped: the engine's module is restored on exit.
    """
    import torch

    import nemo_automodel.components.checkpoint.checkpointing as checkpointing
    from primus.backends.dcp_group import DCPOnTransientGroup

    original = checkpointing.dcp
    if torch.cuda.is_available() or isinstance(original, DCPOnTransientGroup):
        yield
        return
    checkpointing.dcp = DCPOnTransientGroup(original)
    try:
        yield
    finally:
        checkpointing.dcp = original


# -- the LLM recipe on a CPU-only torch --------------------------------------------------
def _to_cpu(device: Any) -> Any:
    import torch

    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    if isinstance(device, str) and device.startswith("cuda"):
        return "cpu"
    if isinstance(device, int) and not isinstance(device, bool):  # a CUDA ordinal
        return "cpu"
    return device


def _cuda_devices_on_cpu():
    """A TorchFunctionMode sending CUDA devices (and CUDA ordinals) to the CPU."""
    from torch.overrides import TorchFunctionMode

    class CudaDevicesOnCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if "device" in kwargs:
                kwargs["device"] = _to_cpu(kwargs["device"])
            name = getattr(func, "__name__", "")
            if name == "cuda":  # Tensor.cuda(): stay where it is
                return args[0]
            if name in ("to", "_parse_to"):  # Tensor.to(0) / Module.to(device) parse a positional device
                args = tuple(_to_cpu(a) for a in args)
            return func(*args, **kwargs)

    return CudaDevicesOnCpu()


@contextmanager
def llm_recipe_on_cpu(setup: bool) -> Iterator[None]:
    """``TrainFinetuneRecipeForNextTokenPrediction`` (0.7.0) on a torch without CUDA.

    Why: its ``setup()`` calls ``torch.cuda.reset_peak_memory_stats()``; ``build_model`` and
    ``NeMoAutoModelForCausalLM.from_pretrained`` hand the model infrastructure
    ``device=torch.device("cuda", torch.cuda.current_device())`` / ``torch.cuda.current_device()``
    (``torch.empty_like(..., device=0)``, ``model.to(device)``); every step reads
    ``torch.cuda.max_memory_allocated()``. On a CPU-only torch each raises. While the recipe sets up
    (``setup=True``) CUDA devices are sent to the CPU; while it trains only the memory statistics
    read 0 (Primus reports peak RSS on CPU). Restored on exit; a no-op where CUDA is available.
    """
    import torch

    if torch.cuda.is_available():
        yield
        return
    saved = {name: getattr(torch.cuda, name) for name in ("reset_peak_memory_stats", "max_memory_allocated",
                                                           "current_device")}
    torch.cuda.reset_peak_memory_stats = lambda *args, **kwargs: None
    torch.cuda.max_memory_allocated = lambda *args, **kwargs: 0
    torch.cuda.current_device = lambda: 0
    mode = _cuda_devices_on_cpu() if setup else None
    try:
        if mode is not None:
            with mode:
                yield
        else:
            yield
    finally:
        for name, value in saved.items():
            setattr(torch.cuda, name, value)


def restored_loader_keeps_the_rng(swap: Swaps = PERMANENT) -> None:
    """A ``StatefulDataLoader`` iterator rebuilt from a checkpoint's state leaves the global torch RNG as
    it was.

    Why: ``_BaseDataLoaderIter.__init__`` draws ``_base_seed`` from the global CPU generator whenever an
    iterator is made (torchdata 0.11.0 then overwrites it from the saved state, or, with no workers, never
    uses it). In an unbroken run the epoch's iterator drew before the checkpoint was written, so that draw
    is already in the RNG state AutoModel restores in ``setup()``; the resumed run's rebuilt iterator draws
    once more, and every later random draw (the diffusion recipe's flow-matching noise and timesteps,
    dropout) shifts: same samples, other losses. A fresh iterator (the next epoch's) still draws, as in the
    unbroken run."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    original = StatefulDataLoader._get_iterator

    def _get_iterator(self: Any) -> Any:
        if self.next_iter_state is None:
            return original(self)
        import torch

        state = torch.random.get_rng_state()
        try:
            return original(self)
        finally:
            torch.random.set_rng_state(state)

    swap.set(StatefulDataLoader, "_get_iterator", _get_iterator)


# -- the records: each context manager around the recipe phase it fixes ----------------------------------
RECIPES = {"diffusion": ("nemo_automodel.recipes.diffusion.train", "TrainDiffusionRecipe"),
           "llm": ("nemo_automodel.recipes.llm.train_ft", "TrainFinetuneRecipeForNextTokenPrediction")}
SETUP, LOOP = "setup", "run_train_validation_loop"


def _recipe_class(kind: str) -> type:
    import importlib

    module, name = RECIPES[kind]
    return getattr(importlib.import_module(module), name)


def _wrap(swap: Swaps, recipe: type, method: str, context: Callable[[], AbstractContextManager]) -> None:
    """``recipe.method`` runs inside ``context()``: what a ``with`` around the call in the run did."""
    original = getattr(recipe, method)

    def wrapped(self, *args: Any, **kwargs: Any) -> Any:
        with context():
            return original(self, *args, **kwargs)

    swap.set(recipe, method, wrapped)


def keep_logging_in_recipes(swap: Swaps = PERMANENT) -> None:
    """``keep_primus_logging`` around setup and the loop of every AutoModel recipe this process imported
    (a run imports its own before its patches apply)."""
    for module, name in RECIPES.values():
        if module in sys.modules:
            recipe = getattr(sys.modules[module], name)
            _wrap(swap, recipe, SETUP, keep_primus_logging)
            _wrap(swap, recipe, LOOP, keep_primus_logging)


def one_train_line_in_diffusion(swap: Swaps = PERMANENT) -> None:
    _wrap(swap, _recipe_class("diffusion"), LOOP, one_train_line)


def llm_recipe_on_cpu_phases(swap: Swaps = PERMANENT) -> None:
    recipe = _recipe_class("llm")
    _wrap(swap, recipe, SETUP, lambda: llm_recipe_on_cpu(setup=True))
    _wrap(swap, recipe, LOOP, lambda: llm_recipe_on_cpu(setup=False))


def transient_checkpoint_groups(swap: Swaps = PERMANENT) -> None:
    swap.enter(checkpoint_on_transient_group())


COMPILING_AT_IMPORT = frozenset({  # those an LLM or Wan run imports (and the launcher planning one)
    "nemo_automodel.components.models.common.utils", "nemo_automodel.components.moe.megatron.moe_utils",
    "nemo_automodel.components.moe.experts", "nemo_automodel.components.models.gpt_oss.rope_utils",
    "nemo_automodel.components.models.bagel.modeling_qwen2_packed"})


def compile_on_first_call(swap: Swaps = PERMANENT) -> None:
    """AutoModel 0.7.0 decorates functions with ``@torch.compile`` at import (``models/common/utils.py``,
    ``moe/megatron/moe_utils.py``, ``moe/experts.py``, ...; an LLM recipe imports them all), which imports
    Inductor's ``compile_fx`` (about 1 s of CPU) in every process that imports AutoModel (the launcher planning
    a run, each rank), whether or not one is called. They compile on their first call instead, with the same
    arguments (``primus.runtime.lazy_compile``).
    It acts on AutoModel's first import, so ``primus.backends.nemo_automodel`` installs it when imported; a
    run's ``Patcher`` finds it in place (the finder is inert afterwards)."""
    from primus.runtime.lazy_compile import install_deferred_compile

    install_deferred_compile(COMPILING_AT_IMPORT, COMPILE_ON_FIRST_CALL)


def eager_float32_rms_norm(swap: Swaps = PERMANENT) -> None:
    """AutoModel 0.7.0's ``Float32RMSNorm`` (its LLMs' default ``rms_norm: torch_fp32``) calls
    ``_float32_rms_norm_fwd``, a ``@torch.compile(dynamic=True)`` function whose body is one opaque custom op
    (``nemo_automodel::float32_rms_norm``, its forward and backward registered in Python). The forward stays
    opaque to Inductor, which can fuse only the backward's few elementwise ops; on CPU that gains less than
    Dynamo, AOTAutograd and Inductor cost: about 4 s of CPU in every rank of every run (a third of a tiny SFT
    run). Here the same op is called eagerly: the same forward, the op's own registered backward (measured:
    losses within 2e-6 relative of the compiled run's)."""
    import torch
    from nemo_automodel.components.models.common import utils

    def float32_rms_norm(x: "torch.Tensor", weight: "torch.Tensor", eps: float) -> "torch.Tensor":
        return torch.ops.nemo_automodel.float32_rms_norm(x, weight, eps)

    swap.set(utils, "_float32_rms_norm_fwd", float32_rms_norm)


AUTOMODEL = SpecifierSet(">=0.7.0")  # written against 0.7.0; check_version warns on any other
LLM = uses("llm", "the run is an LLM recipe (sft, lora)")

COMPILE_ON_FIRST_CALL = Patch("compile_on_first_call", "MoE and model utilities torch.compile at import, which "
                              "imports Inductor (about 1 s of CPU per process)", "nemo-automodel", AUTOMODEL, NO_GPU,
                              compile_on_first_call)

PATCHES = [
    COMPILE_ON_FIRST_CALL,
    Patch("llm_recipe_on_cpu", "the LLM recipe calls CUDA-only device and memory functions", "nemo-automodel",
          AUTOMODEL, LLM & NO_GPU, llm_recipe_on_cpu_phases),
    Patch("eager_float32_rms_norm", "the fp32 RMSNorm torch.compiles an opaque op on first call: about 4 s of CPU "
          "a rank for a fused backward of a few elementwise ops", "nemo-automodel", AUTOMODEL, LLM & NO_GPU,
          eager_float32_rms_norm),
    Patch("checkpoint_on_transient_group", "DCP on gloo's default group leaves OpenMP pools that slow every "
          "later step", "nemo-automodel", AUTOMODEL, NO_GPU, transient_checkpoint_groups),
    Patch("one_train_line", "AutoModel logs its own 0-based [TRAIN] line next to Primus's", "nemo-automodel",
          AUTOMODEL, uses("diffusion", "the run is a diffusion recipe (pretrain, finetune)"),
          one_train_line_in_diffusion),
    Patch("keep_primus_logging", "setup_logging replaces Primus's formats and silences ranks > 0 for good",
          "nemo-automodel", AUTOMODEL, ALWAYS, keep_logging_in_recipes),
    Patch("restored_loader_keeps_the_rng", "a dataloader iterator rebuilt from a checkpoint draws from the global "
          "RNG the checkpoint restored: a resumed run's noise differs from the unbroken run's", "torchdata",
          SpecifierSet(">=0.11.0"), ALWAYS, restored_loader_keeps_the_rng),
]


def params_uses(params: dict[str, Any]) -> frozenset[str]:
    """Nothing beyond the recipe's own ``patch_uses`` (the LLM recipe or the diffusion one)."""
    return frozenset()
