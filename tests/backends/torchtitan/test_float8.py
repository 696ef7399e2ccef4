"""Float8 training through TorchTitan 0.3.0's own converter on torchao (``primus/backends/torchtitan/float8.py``):
the settings are the converter's fields, each recipe builds torchao's Float8Linear layers with that recipe's
scaling, a target without FP8 units is refused with the reason, and a tiny run's loss follows fp32's."""
import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")
pytest.importorskip("torchao")

from primus.config.errors import ConfigError  # noqa: E402
from primus.plan.target import Target, named_target  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

EXAMPLE = ROOT / "examples" / "torchtitan" / "llama3_tiny-float8.yaml"


@pytest.fixture(scope="module", autouse=True)
def _engine():
    from primus.backends.torchtitan.patches import apply_patches

    apply_patches()  # before any torchtitan import (its device, the triton stand-in)


def build(*overrides: str):
    """``build_trainer_config`` on the float8 example with command-line overrides, as validation runs it."""
    from primus.backends.torchtitan.config import build_trainer_config
    from primus.config.resolve import resolve_experiment
    from primus.runtime.registry import backend_defaults

    resolved = resolve_experiment(EXAMPLE, list(overrides), backend_defaults)
    params = resolved.modules["pre_trainer"].params
    return build_trainer_config(params, run_dir=EXAMPLE.parent, device="cpu", provenance=resolved.provenance)


def test_the_settings_are_fields_of_torchtitans_converter_config():
    from torchtitan.components.quantization.float8 import Float8LinearConverter

    from primus.backends.torchtitan.float8 import RECIPES, Float8Settings

    fields = {f.name for f in dataclasses.fields(Float8LinearConverter.Config)}
    assert set(Float8Settings.model_fields) == fields - {"model_compile_enabled"}  # that one is Primus's
    from torchao.float8 import Float8LinearConfig

    for recipe in RECIPES:  # every recipe Primus admits is one torchao builds
        Float8LinearConfig.from_recipe_name(recipe)


@pytest.mark.parametrize("recipe, granularity", [("rowwise", "axiswise"), ("tensorwise", "tensorwise"),
                                                 ("rowwise_with_gw_hp", "axiswise")])
def test_each_recipe_builds_torchao_float8_layers_that_train(recipe, granularity):
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear

    cfg, _, derived = build(f"model.converters.float8.recipe_name={recipe}")
    said = {key: value for key, value, _ in derived}
    assert said["model.converters.float8"] == f"{recipe}, 11 Linear layers"  # 2 x (wqkv, wo, w1, w2, w3) + lm_head
    torch.manual_seed(0)
    model = cfg.model_spec.model.build()
    model.init_states(buffer_device=None)
    layers = [m for m in model.modules() if isinstance(m, Float8Linear)]
    assert len(layers) == 11
    expected = Float8LinearConfig.from_recipe_name(recipe)
    assert all(layer.config == expected for layer in layers)
    assert layers[0].config.cast_config_input.scaling_granularity.value == granularity
    tokens = torch.randint(0, 512, (2, 32))
    loss = model(tokens).float().logsumexp(-1).mean()
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("override, message", [
    ("model.converters.float8.recipe_name=columnwise", "model.converters.float8.recipe_name: 'columnwise'"),
    ("model.converters.float8.emulate=true", "TorchTitan 0.3.0's emulation always builds torchao's tensorwise"),
    ("model.converters.float8.filter_fqn=[lm_head]", "model.converters.float8.filter_fqn"),
    ("model.converters.mx={}", "model.converters.mx: TorchTitan's MXFP8 converter (needs NVIDIA SM 10.0+) is not "
                               "wired in Primus; wired: float8"),
    ("model.converters.flaot8={}", "unknown converter (did you mean 'float8'?)"),
])
def test_bad_float8_settings_are_one_line_naming_the_key(override, message):
    with pytest.raises(ConfigError) as error:
        build(override)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_filter_fqns_keep_layers_in_high_precision():
    cfg, _, derived = build("model.converters.float8.filter_fqns=[lm_head, feed_forward]")
    said = {key: value for key, value, _ in derived}
    assert said["model.converters.float8"] == "rowwise, 4 Linear layers"  # wqkv and wo of 2 layers


def test_which_targets_run_float8():
    from primus.backends.torchtitan.float8 import Float8Settings, refusal

    rowwise = Float8Settings()
    assert refusal(rowwise, Target("cpu")) is None  # torch's CPU _scaled_mm has float8 kernels
    for device in ("h100", "h200", "b200", "mi300x", "mi325x", "mi355x"):
        assert refusal(rowwise, named_target(device)) is None, device
    a100 = refusal(rowwise, named_target("a100"))
    assert a100.startswith("torchao's float8 GEMMs need FP8 units (NVIDIA SM 8.9+") and "sm_80" in a100
    assert refusal(Float8Settings(recipe_name="tensorwise", emulate=True), named_target("a100")) is None


def test_a_gpu_without_fp8_units_is_refused_before_any_rank_starts():
    """Admission (the TorchTitan recipes' ``admit``, asked by validate, plan, dry-run and the launch) on a GPU
    without FP8 units; the same module is admitted on an MI300X."""
    from primus.backends.torchtitan.adapter import TorchTitanAdapter
    from primus.backends.torchtitan.recipes.pretrain import TorchTitanPretrain
    from primus.runtime.adapter import ModuleConfig
    from primus.runtime.admission import Admission

    module = ModuleConfig("pre_trainer", "torchtitan", "pretrain", {"model": {"converters": {"float8": {}}}})
    plan = type("Plan", (), {"module": module, "recipe": TorchTitanPretrain(TorchTitanAdapter())})()
    a100 = named_target("a100")
    with pytest.raises(ConfigError) as error:
        Admission(a100, "pre_trainer", TorchTitanAdapter().admit(plan, a100)).check()
    assert str(error.value).startswith("modules.pre_trainer.model.converters.float8: cannot run on a100 (sm_80) ")
    assert "FP8 units" in str(error.value)
    assert TorchTitanAdapter().admit(plan, named_target("mi300x")) == []


def test_llama4_on_the_transformers_backend_is_admitted_in_float8_where_llama3_is():
    from primus.backends.torchtitan.float8 import admission_refusal

    params = {"model": {"name": "llama4", "flavor": "17bx16e", "converters": {"float8": {"recipe_name": "tensorwise"}}}}
    for device in ("mi300x", "mi325x", "mi355x", "h100"):
        assert admission_refusal(params, named_target(device)) is None, device
    assert admission_refusal(params, Target("cpu")) is None  # torch's CPU _scaled_mm has float8 kernels
    key, reason = admission_refusal(params, named_target("a100"))
    assert key == "model.converters.float8" and reason.startswith("torchao's float8 GEMMs need FP8 units")
    assert admission_refusal({"model": {"name": "llama3", "flavor": "8B"}}, Target("cpu")) is None  # no converter


@pytest.mark.e2e
def test_a_tiny_float8_run_follows_the_fp32_run(run_primus, workspace):
    """20 steps on the same data and seed: float8 (rowwise, torch's CPU float8 GEMMs) against fp32."""
    from tests.helpers import losses, run_dir_of

    # torchao runs a row-wise GEMM without fast accumulation (the backward's) as torch's tensor-wise kernel with
    # unit scales, then scales the output (a CUDA choice); on CPU, torch 2.13's tensor-wise float8 _scaled_mm
    # is ~300x slower than its row-wise one (~1 s a step at 32 tokens, 4 s at 128): a short run of small batches
    small = ("training.steps=20", "training.local_batch_size=1", "training.seq_len=32")
    runs = {}
    for name, converters in (("fp32", "model.converters=null"),
                             ("float8", "model.converters.float8.recipe_name=rowwise")):
        result = run_primus("train", EXAMPLE, f"exp_name={name}", converters, *small, timeout=600)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        runs[name] = losses(run_dir_of(workspace, name))
    info = (run_dir_of(workspace, "float8") / "logs" / "pre_trainer" / "rank-0" / "info.log").read_text()
    assert "derived model.converters.float8=rowwise, 11 Linear layers" in info
    debug = (run_dir_of(workspace, "float8") / "logs" / "pre_trainer" / "rank-0" / "debug.log").read_text()
    assert "torchtitan patch applied: float8_on_cpu: " in debug
    assert len(runs["fp32"]) == len(runs["float8"]) == 20
    assert runs["float8"][-1] < 0.6 * runs["float8"][0], runs  # it learns (6.97 -> 3.50 measured)
    assert runs["float8"][-1] == pytest.approx(runs["fp32"][-1], rel=0.05), (runs["fp32"][-1], runs["float8"][-1])
    assert runs["float8"] != runs["fp32"]  # float8 GEMMs ran: not the fp32 numbers
