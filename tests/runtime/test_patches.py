"""The one patch registry: conditions read for a GPU, an exact undo, the run's log lines, ``primus patches``.

Unit tests: the engines' patch records are evaluated and (megatron-core, TorchTitan) applied and undone
in this process; nothing trains and no engine subprocess starts."""
from __future__ import annotations

import logging
import types

import pytest
from packaging.specifiers import SpecifierSet

from primus.runtime.patches import ALWAYS, NO_GPU, Patch, Patcher, Swaps, Where, uses

# the patches that exist because there is no CUDA/ROCm device, per engine
CPU_ONLY = {
    "torchtitan": {"cpu_device_type", "triton_import_stub", "gloo_sum_reduction", "sharded_init_on_cpu",
                   "checkpoint_on_transient_group", "hf_backend_sdpa_on_cpu", "float8_on_cpu", "compile_on_first_call",
                   "end_of_training_barrier"},
    "megatron": {"patch_current_device", "patch_rng_tracker", "patch_recompute_rng", "patch_cuda_device_arguments",
                 "patch_param_type_checks", "patch_moe_router_gemm_name",
                 "patch_alltoall_dispatcher_without_cuda_streams", "patch_cpu_expert_init_across_ep_ranks",
                 "patch_torch_fsdp2_cpu_mesh", "patch_lazy_fusion_compile", "patch_checkpoint_results_queue_by_fork"},
    "nemo_automodel": {"llm_recipe_on_cpu", "checkpoint_on_transient_group", "compile_on_first_call",
                       "eager_float32_rms_norm"},
}
EVERY_PART = frozenset({"float8", "llama4", "llm", "diffusion", "sanitize_nan_grads"})


def _records(engine: str) -> list[Patch]:
    import importlib

    return importlib.import_module(f"primus.backends.{engine}.patches").PATCHES


def _applying(engine: str, where: Where) -> set[str]:
    return {patch.name for patch in _records(engine) if patch.verdict(where)[0]}


@pytest.mark.parametrize("engine", sorted(CPU_ONLY))
def test_cpu_only_patches_do_not_apply_where_cuda_is(engine, monkeypatch):
    import torch

    if not torch.cuda.is_available():  # the CPU host: every one of them applies (a run that uses every part)
        assert CPU_ONLY[engine] <= _applying(engine, Where.here(EVERY_PART)) | {"triton_import_stub"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "NVIDIA H100 80GB HBM3")
    here = Where.here(EVERY_PART)
    assert here.gpu and here.device == "NVIDIA H100 80GB HBM3"
    applied = _applying(engine, here)
    assert not applied & (CPU_ONLY[engine] - {"triton_import_stub"})  # this host's triton is this host's
    named = Where(gpu=True, device="mi355x", uses=EVERY_PART, assumed=True)  # `primus patches --device mi355x`
    assert not _applying(engine, named) & CPU_ONLY[engine]
    assert applied  # upstream bugs are fixed on a GPU too


def test_the_records_say_why_in_one_line_and_name_each_patch_once():
    for engine in CPU_ONLY:
        names = [patch.name for patch in _records(engine)]
        assert len(names) == len(set(names)), engine
        assert all(patch.why and "\n" not in patch.why and str(patch.versions) for patch in _records(engine))


def test_a_version_outside_the_range_applies_nothing():
    patch = Patch("future", "x", "torch", SpecifierSet("<1"), ALWAYS, lambda swap: pytest.fail("applied"))
    applied, reason = patch.verdict(Where(gpu=False))
    assert not applied and "torch" in reason and "outside <1" in reason


class _Base:
    def method(self):
        return "base"


class _Child(_Base):
    pass


def test_undo_restores_attributes_items_inherited_methods_and_modes():
    import torch
    from torch.overrides import TorchFunctionMode

    module = types.ModuleType("engine_under_test")
    module.function = original_function = lambda: "original"
    table = {"kept": 1}

    def replace_everything(swap: Swaps) -> None:
        swap.set(module, "function", lambda: "patched")
        swap.set(module, "added", "new")
        swap.set(_Child, "method", lambda self: "patched")  # inherited: restored by deleting it
        swap.set_item(table, "kept", 2)
        swap.set_item(table, "added", 3)
        swap.enter(TorchFunctionMode())

    modes = len(torch.overrides._get_current_function_mode_stack())
    record = Patch("everything", "test", "torch", SpecifierSet(">=2"), ALWAYS, replace_everything)
    with Patcher([record], Where(gpu=False)) as patcher:
        assert patcher.names() == ["everything"]
        assert module.function() == "patched" and _Child().method() == "patched" and table == {"kept": 2, "added": 3}
        assert len(torch.overrides._get_current_function_mode_stack()) == modes + 1
    assert module.function is original_function and not hasattr(module, "added")
    assert "method" not in vars(_Child) and _Child().method() == "base"
    assert table == {"kept": 1}
    assert len(torch.overrides._get_current_function_mode_stack()) == modes


class _Spy(Swaps):
    """Swaps that also remember each owner's attribute as it was before the patch replaced it."""

    def __init__(self) -> None:
        super().__init__()
        self.before: list[tuple[object, str, object]] = []

    def set(self, owner: object, name: str, value: object) -> None:
        self.before.append((owner, name, vars(owner).get(name, "<absent>")))
        super().set(owner, name, value)


@pytest.mark.parametrize("engine", ["megatron", "torchtitan"])
def test_undo_restores_every_attribute_an_engines_patches_replaced(engine):
    import torch

    pytest.importorskip({"megatron": "megatron.core", "torchtitan": "torchtitan"}[engine])
    modes = len(torch.overrides._get_current_function_mode_stack())
    spy = _Spy()
    patcher = Patcher(_records(engine), Where(gpu=False, uses=frozenset({"sanitize_nan_grads"})))  # a run option
    patcher.apply(spy)
    try:
        if engine == "megatron":  # the CPU device mode is entered while the run lasts
            assert len(torch.overrides._get_current_function_mode_stack()) == modes + 1
        assert spy.before, "nothing was replaced: the patches were applied in this process already"
    finally:
        patcher.undo()
    changed = [f"{getattr(owner, '__name__', owner)}.{name}" for owner, name, before in spy.before
               if vars(owner).get(name, "<absent>") is not before]
    assert not changed
    assert len(torch.overrides._get_current_function_mode_stack()) == modes


def test_a_failing_patch_undoes_the_ones_applied_before_it():
    module = types.ModuleType("engine_under_test")
    module.value = "original"

    def fails(swap: Swaps) -> None:
        raise RuntimeError("upstream moved")

    records = [Patch("first", "x", "torch", SpecifierSet(">=2"), ALWAYS, lambda swap: swap.set(module, "value", 1)),
               Patch("second", "x", "torch", SpecifierSet(">=2"), ALWAYS, fails)]
    with pytest.raises(RuntimeError, match="upstream moved"):
        with Patcher(records, Where(gpu=False)):
            pass
    assert module.value == "original"


def test_the_run_log_names_each_patch_applied_and_why(caplog):
    noop = lambda swap: None  # noqa: E731
    records = [Patch("cpu_fix", "the engine assumes CUDA", "torch", SpecifierSet(">=2"), NO_GPU, noop),
               Patch("float8_fix", "float8 needs it", "torch", SpecifierSet(">=2"), uses("float8", "float8"), noop),
               Patch("old_torch", "needed before 1.0", "torch", SpecifierSet("<1"), NO_GPU, noop)]
    with caplog.at_level(logging.DEBUG, logger="run"), Patcher(records, Where(gpu=False, uses=frozenset())) as p:
        p.log(logging.getLogger("run"), "engine")
    applied = [r for r in caplog.records if "patch applied" in r.getMessage()]
    assert len(applied) == 1 and applied[0].levelno == logging.DEBUG  # the rank's debug.log, not the console
    assert applied[0].getMessage().startswith("engine patch applied: cpu_fix: the engine assumes CUDA [no CUDA/ROCm device")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "old_torch" in warnings[0] and "outside <1" in warnings[0]  # needed, too new
    assert any("float8_fix" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)


# -- primus patches ---------------------------------------------------------------------------------------------
def _blocks(out: str) -> dict[str, dict[str, set[str]]]:
    """{engine: {"applies": names, "does not apply": names}} from the command's output."""
    found: dict[str, dict[str, set[str]]] = {}
    engine = section = None
    for line in out.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            engine = line[:-1]
            found[engine] = {}
        elif line.startswith("  ") and not line.startswith("   "):
            section = line.strip().split(" (")[0]
            found[engine][section] = set()
        elif line.startswith("    ") and not line.startswith("     ") and line.strip() != "-":
            found[engine][section].add(line.strip().split(":")[0])
    return found


def test_primus_patches_for_a_named_gpu(capsys):
    from primus.cli.main import main

    assert main(["patches", "--device", "h100"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("patches for h100")
    blocks = _blocks(out)
    assert set(blocks) >= {"torchtitan", "megatron"}
    for engine, names in CPU_ONLY.items():
        if engine in blocks:
            assert not blocks[engine]["applies"] & names
            assert names <= blocks[engine]["does not apply"]
    assert "peak_flops_from_primus_table" in blocks["torchtitan"]["applies"]
    assert "patch_fsdp2_finish_grad_sync_signature" in blocks["megatron"]["applies"]
    assert "[not needed: applies when no CUDA/ROCm device]" in out


def test_primus_patches_for_an_experiment_lists_its_engine_only(capsys):
    from primus.cli.main import main
    from tests.conftest import TINY_EXAMPLE

    assert main(["patches", str(TINY_EXAMPLE), "--device", "cpu"]) == 0
    blocks = _blocks(capsys.readouterr().out)
    assert list(blocks) == ["torchtitan"]
    assert {"cpu_device_type", "gloo_sum_reduction"} <= blocks["torchtitan"]["applies"]
    assert "float8_on_cpu" in blocks["torchtitan"]["does not apply"]  # the tiny Llama 3 converts nothing


def test_primus_patches_user_errors_are_one_line_exit_2(capsys):
    from primus.cli.main import main

    assert main(["patches", "--device", "tpu-v5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device tpu-v5: unknown device" in err[0]
    assert main(["patches", "missing.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.yaml: experiment file not found" in err[0]


def test_primus_patches_leaves_nothing_applied(capsys):
    """The command evaluates conditions only: no engine attribute changes."""
    import torch

    from primus.cli.main import main

    before = torch.cuda.current_device
    assert main(["patches"]) == 0
    assert torch.cuda.current_device is before
    assert "depends on the run" in capsys.readouterr().out
