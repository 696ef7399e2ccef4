"""Float8 training on TorchTitan 0.3.0's own converter (``Float8LinearConverter``, on torchao).

In an experiment::

    model:
      ...                       # the neutral Llama keys or a registry name/flavor
      converters:
        float8: {recipe_name: rowwise, filter_fqns: [lm_head]}

TorchTitan 0.3.0 applies a converter to the model's config tree before the model is built (its
``model_registry(flavor, converters=[...])``): every ``Linear`` whose dims are multiples of 16,
except those named in ``filter_fqns``, becomes torchao's ``Float8Linear``. The keys are the
converter's ``Config`` fields; ``model_compile_enabled`` is Primus's (from ``compile``).

Recipes (torchao's ``Float8LinearConfig.from_recipe_name``): ``rowwise`` (TorchTitan 0.3.0's
default), ``rowwise_with_gw_hp`` and ``tensorwise`` (TorchTitan 0.2's recipe when none was named;
0.3.0's type hint omits it but its converter passes the name to torchao unchanged).

Llama 4 is built by TorchTitan's transformers backend, one ``HFTransformerModel.Config`` with no
``Linear`` configs inside, so the converter finds nothing to convert. There the same converter (its
torchao config per recipe, its ``emulate``, its hardware check and its module filter) picks the layers
and torchao's ``convert_to_float8_training`` swaps them in the built model, on the meta device, before
FSDP, activation checkpointing and compile wrap it (``Float8BeforeParallelize``). Only plain
``nn.Linear`` layers are swapped: ``Llama4Router`` subclasses ``nn.Linear`` with its own top-1 forward,
and the MoE experts' weights are 3-D parameters (``Llama4TextExperts``), not Linears; both stay in
high precision (float8 MoE GEMMs are TorchTitan's ``Float8GroupedExpertsConverter``, for its own MoE only).

Where it runs: torchao's float8 GEMMs (``torch._scaled_mm``) need FP8 units on a GPU (NVIDIA SM
8.9+, AMD MI300+), or the CPU, whose ``torch._scaled_mm`` runs float8 in torch 2.13 (TorchTitan's
converter checks only for the GPUs: the ``float8_on_cpu`` patch). ``emulate: true`` runs torchao's
emulation on any device (eager mode, for tests).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, ValidationError

from primus.plan.target import Target, has_fp8_gemm

Recipe = Literal["rowwise", "rowwise_with_gw_hp", "tensorwise"]
RECIPES = get_args(Recipe)
CONVERTERS = ("float8",)  # Primus's names in model.converters (TorchTitan 0.3.0's Float8LinearConverter)
NOT_WIRED = {"mx": "TorchTitan's MXFP8 converter (needs NVIDIA SM 10.0+)",
             "nvfp4": "TorchTitan's NVFP4 converter (needs NVIDIA SM 10.0+)",
             "float8_grouped_experts": "float8 MoE grouped GEMMs (TorchTitan's Float8GroupedExpertsConverter)"}
HF_BACKEND_SCOPE = ("torchao's Float8Linear swapped into the transformers model before FSDP (nn.Linear layers with "
                    "every dim a multiple of 16, minus filter_fqns); Llama4Router and the MoE experts' 3-D weights "
                    "stay in high precision")


class Float8Settings(BaseModel):
    """``Float8LinearConverter.Config``'s fields an experiment sets (tests check them against it)."""

    model_config = ConfigDict(extra="forbid")

    recipe_name: Recipe = "rowwise"
    filter_fqns: list[str] = []
    emulate: bool = False


def parse_converters(block: Any, fail) -> Float8Settings | None:
    """``model.converters`` -> the float8 settings (None: no converter); one-line errors via ``fail``."""
    if block in (None, {}):
        return None
    if not isinstance(block, dict):
        raise fail("model.converters", f"{block!r}: a mapping of converter name to its settings, "
                                       "e.g. {float8: {recipe_name: rowwise}}")
    for name in block:
        if name in NOT_WIRED:
            raise fail(f"model.converters.{name}", f"{NOT_WIRED[name]} is not wired in Primus; "
                                                   f"wired: {', '.join(CONVERTERS)}")
        if name not in CONVERTERS:
            from primus.config.errors import did_you_mean

            raise fail(f"model.converters.{name}", f"unknown converter{did_you_mean(str(name), CONVERTERS)}; "
                                                   f"known: {', '.join(CONVERTERS)}")
    try:
        settings = Float8Settings.model_validate(block["float8"] or {})
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(["model.converters.float8", *(str(part) for part in error["loc"])])
        raise fail(key, f"{error.get('input')!r}: {error['msg']}") from None
    if settings.emulate and settings.recipe_name != "tensorwise":
        raise fail("model.converters.float8.emulate", f"true with recipe_name {settings.recipe_name}: TorchTitan "
                   "0.3.0's emulation always builds torchao's tensorwise config, so the recipe would be ignored; "
                   "use recipe_name: tensorwise, or emulate: false")
    return settings


def refusal(settings: Float8Settings, target: Target) -> str | None:
    """Why float8 training cannot run on ``target`` (None: it can)."""
    import importlib.util

    if importlib.util.find_spec("torchao") is None:
        return "torchao is not installed (primus prepare torchtitan installs torchao==0.18.0)"
    if settings.emulate or (target.gpu and has_fp8_gemm(target)):
        return None
    if not target.gpu:
        return None if cpu_scaled_mm_float8() else "this torch's CPU torch._scaled_mm has no float8 kernels"
    return (f"torchao's float8 GEMMs need FP8 units (NVIDIA SM 8.9+: L40S, H100, H200, B200; AMD gfx942+: MI300X, "
            f"MI325X, MI355X); {target.describe()} has none (model.converters.float8.emulate: true emulates it, "
            "for tests)")


def admission_refusal(params: dict[str, Any], target: Target) -> tuple[str, str] | None:
    """``(key, reason)`` when the module's float8 converter cannot run on ``target``; None when it can
    (or no converter is set). The launcher asks this before any rank starts."""
    from primus.config.errors import ConfigError

    model = params.get("model") or {}
    settings = parse_converters(model.get("converters"), lambda key, message: ConfigError(f"{key}: {message}"))
    problem = refusal(settings, target) if settings is not None else None
    return ("model.converters.float8", problem) if problem else None


def convert(model_config: Any, settings: Float8Settings, *, compile_enabled: bool) -> Any:
    """The model config tree with TorchTitan's float8 converter applied, as ``model_registry`` does
    (at plan time: no patch stays applied)."""
    from torchtitan.components.quantization.float8 import Float8LinearConverter

    config = Float8LinearConverter.Config(model_compile_enabled=compile_enabled, **settings.model_dump())
    with float8_converter_admitted():
        return config.build().convert(model_config)


def converted_linears(model_config: Any) -> int:
    """How many Linear configs of the tree are float8 now (0: every dim failed the multiple-of-16 rule)."""
    from torchtitan.components.quantization.float8 import Float8Linear
    from torchtitan.models.common.linear import Linear

    if Float8Linear is None:  # torchao not installed
        return 0
    return sum(isinstance(config, Float8Linear.Config) for _, config, _, _ in model_config.traverse(Linear.Config))


def _converter(settings: Float8Settings, compile_enabled: bool) -> Any:
    """TorchTitan's converter itself, for what it decides: the torchao config of the recipe (``emulate``'s
    tensorwise one), the hardware check, the module filter (dims, ``filter_fqns``, ``auto_filter_small_kn``)."""
    from torchtitan.components.quantization.float8 import Float8LinearConverter

    config = Float8LinearConverter.Config(model_compile_enabled=compile_enabled, **settings.model_dump())
    return config.build()


def _float8_filter(converter: Any) -> Callable[[Any, str], bool]:
    """The converter's filter, on plain ``nn.Linear`` only: a subclass has a forward of its own (``Llama4Router``
    picks the top-1 expert in it), which Float8Linear's would replace."""
    import torch.nn as nn

    return lambda module, fqn: type(module) is nn.Linear and converter.filter_fn(module, fqn)


def swap_hf_linears(model: Any, settings: Float8Settings, *, compile_enabled: bool) -> list[str]:
    """torchao's float8 swap on a built transformers-backend model; returns the swapped layers' names (the
    backend's flattened view: ``layers.0.self_attn.q_proj``, ``lm_head``, as TorchTitan names them)."""
    from torchao.float8 import convert_to_float8_training
    from torchtitan.tools.logging import logger

    converter = _converter(settings, compile_enabled)
    if not converter.enabled:  # torchao too old for recipes: the converter said so, and converts nothing too
        return []
    keep, swapped = _float8_filter(converter), []

    def chosen(module: Any, fqn: str) -> bool:
        if keep(module, fqn):
            swapped.append(fqn)
            return True
        return False

    convert_to_float8_training(model, module_filter_fn=chosen, config=converter.torchao_config)
    logger.info(f"float8 ({settings.recipe_name}{', emulated' if settings.emulate else ''}): {len(swapped)} Linear "
                "layers of the transformers model are torchao Float8Linear; the MoE experts' 3-D weights and the "
                "router stay in high precision")
    return swapped


def hf_linears_to_swap(hf_config_json: str, settings: Float8Settings, *, compile_enabled: bool) -> int:
    """How many layers ``swap_hf_linears`` will swap, counted on the transformers model built on the meta
    device (a plan: nothing is allocated, no patch stays applied)."""
    import json

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    values = json.loads(hf_config_json)
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    with float8_converter_admitted():
        converter = _converter(settings, compile_enabled)
    if not converter.enabled:
        return 0
    keep = _float8_filter(converter)
    # the causal LM's own names; the backend's view drops the leading "model." (layers.N..., lm_head)
    return sum(keep(module, fqn.removeprefix("model.")) for fqn, module in model.named_modules())


@dataclasses.dataclass(frozen=True)
class Float8BeforeParallelize:
    """A transformers-backend ``ModelSpec.parallelize_fn`` that swaps in float8 first: TorchTitan's trainer
    builds the model on the meta device and hands it to ``parallelize_fn`` before anything wraps it, which
    is where TorchTitan's converter would have acted on a native model's config."""

    settings: Float8Settings
    compile_enabled: bool
    parallelize: Callable[..., Any]

    def __call__(self, model: Any, **kwargs: Any) -> Any:
        swap_hf_linears(model, self.settings, compile_enabled=self.compile_enabled)
        return self.parallelize(model, **kwargs)


def with_hf_float8(spec: Any, settings: Float8Settings, *, compile_enabled: bool) -> Any:
    """The transformers-backend ``ModelSpec`` whose parallelisation starts with the float8 swap."""
    return dataclasses.replace(spec, parallelize_fn=Float8BeforeParallelize(settings, compile_enabled,
                                                                            spec.parallelize_fn))


# -- float8 on a CPU host: torch's CPU _scaled_mm has float8 kernels (the patch is ``patches.float8_on_cpu``)
@contextmanager
def capability_gate_open(float8: Any):
    """The converter's capability check answers yes (this host's CPU: float8 ``_scaled_mm``), then as before."""
    gate = float8.has_cuda_capability
    float8.has_cuda_capability = lambda major, minor: True
    try:
        yield
    finally:
        float8.has_cuda_capability = gate


@contextmanager
def float8_converter_admitted() -> Iterator[None]:
    """``float8_on_cpu`` for one conversion only, undone afterwards: a plan converts the model config
    and leaves TorchTitan as it was (a run applies the patch itself, ``patches.float8_on_cpu``)."""
    import torch
    import torchtitan.components.quantization.float8 as float8

    if torch.cuda.is_available() or not cpu_float8_gemm():
        yield
        return
    with capability_gate_open(float8):
        yield


def cpu_scaled_mm_float8() -> bool:
    """torch's CPU ``_scaled_mm`` multiplies float8 matrices (torch 2.13 does, tensorwise and rowwise)."""
    import torch

    try:
        a = torch.ones(16, 16).to(torch.float8_e4m3fn)
        one = torch.ones(())
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
        return True
    except (RuntimeError, NotImplementedError, AttributeError):
        return False


def cpu_float8_gemm() -> bool:
    """torchao is installed and this torch's CPU ``_scaled_mm`` has float8 kernels."""
    import importlib.util

    return importlib.util.find_spec("torchao") is not None and cpu_scaled_mm_float8()
