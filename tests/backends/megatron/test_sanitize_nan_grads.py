"""``primus.sanitize_nan_grads``: a NaN in one parameter's gradient is zeroed in megatron-core's DDP grad
buffer before its check and reduction, and training goes on; without the switch megatron-core's check stops it.

In-process: megatron-core's real DistributedDataParallel, grad buffer and optimizer on a one-rank gloo
group, with the run's patches applied through the ``Patcher`` (and undone) for what the run uses.
"""
from __future__ import annotations

import math
import tempfile

import pytest

pytest.importorskip("megatron.core")
torch = pytest.importorskip("torch")

NAN_STEP = 1  # the step whose backward makes one gradient element NaN


@pytest.fixture
def one_rank():
    """A one-rank gloo world with megatron-core's parallel state and rerun machine (disabled, as the trainer)."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.rerun_state_machine import RerunMode, destroy_rerun_state_machine, \
        initialize_rerun_state_machine

    dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel()
        destroy_rerun_state_machine()
        initialize_rerun_state_machine(mode=RerunMode.DISABLED)
        yield
    finally:
        destroy_rerun_state_machine()
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def _train(sanitize: bool, steps: int = 3, **ddp_options) -> list[tuple[float, float, int]]:
    """(loss, grad norm, elements zeroed) per step of a two-layer MLP under megatron-core's DDP and Adam;
    at ``NAN_STEP`` a hook makes one element of the first layer's weight gradient NaN."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig

    from primus.backends.megatron.option_patches import take_sanitized
    from primus.backends.megatron.patches import PATCHES, params_uses
    from primus.runtime.patches import Patcher, Where

    uses = params_uses({"primus": {"sanitize_nan_grads": sanitize}})
    with Patcher(PATCHES, Where.here(uses)) as patcher:
        assert ("sanitize_nan_grads" in patcher.names()) is sanitize
        device = "cuda" if torch.cuda.is_available() else "cpu"
        torch.manual_seed(0)
        mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(device)
        config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)
        model = DistributedDataParallel(config, DistributedDataParallelConfig(**ddp_options), mlp)
        optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-2, clip_grad=1.0), [model])
        weight, step = mlp[0].weight, {"n": 0}
        weight.register_hook(lambda grad: grad.index_put((torch.tensor([0]), torch.tensor([0])),
                                                         torch.tensor(float("nan"))) if step["n"] == NAN_STEP else grad)
        x, y = torch.randn(32, 8, device=device), torch.randn(32, 1, device=device)
        out = []
        for step["n"] in range(steps):
            model.zero_grad_buffer()
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            model.finish_grad_sync()  # megatron-core's check, then the DP reduction
            zeroed = take_sanitized()
            _, grad_norm, _ = optimizer.step()
            out.append((loss.item(), float(grad_norm), zeroed))
        assert all(torch.isfinite(p).all() for p in mlp.parameters())
        return out


@pytest.mark.parametrize("ddp_options", [
    {}, {"use_distributed_optimizer": True}, {"overlap_grad_reduce": True},
    {"check_for_nan_in_grad": False}], ids=["ddp", "distributed_optimizer", "overlap_grad_reduce", "check_off"])
def test_a_nan_gradient_element_is_zeroed_and_training_goes_on(one_rank, ddp_options):
    steps = _train(sanitize=True, **{"check_for_nan_in_grad": True, **ddp_options})
    assert [zeroed for _, _, zeroed in steps] == [0, 1, 0]  # said once per step: the one element, on its step
    assert all(math.isfinite(loss) and math.isfinite(norm) for loss, norm, _ in steps)
    assert steps[-1][0] < steps[0][0]  # the other elements' updates still ran


def test_without_the_switch_megatron_cores_check_stops_the_step(one_rank):
    from primus.backends.megatron.option_patches import take_sanitized

    with pytest.raises(RuntimeError, match="found NaN in local grad norm"):
        _train(sanitize=False, check_for_nan_in_grad=True)
    assert take_sanitized() == 0


def test_the_patch_is_undone_after_the_run(one_rank):
    from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBucketGroup

    before = _ParamAndGradBucketGroup.start_grad_sync
    _train(sanitize=True, steps=2, check_for_nan_in_grad=True)
    assert _ParamAndGradBucketGroup.start_grad_sync is before


# -- the switch, from an experiment: the patch record it selects, and admission ------------------------------------
def _example() -> str:
    from tests.conftest import ROOT

    return str(ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml")


def test_primus_patches_lists_it_for_a_run_that_sets_the_switch_only():
    from tests.helpers import cli_in_process

    for value, applies in (("true", True), ("false", False)):
        result = cli_in_process("patches", _example(), f"primus.sanitize_nan_grads={value}", "--device", "cpu")
        assert result.returncode == 0, result.stderr
        section = None
        for line in result.stdout.splitlines():
            if line.startswith("  ") and not line.startswith("   "):
                section = line.strip().startswith("applies")
            elif line.startswith("    sanitize_nan_grads: "):
                assert section is applies, result.stdout
                break
        else:
            pytest.fail(f"sanitize_nan_grads not listed:\n{result.stdout}")


def test_with_fsdp_the_switch_is_refused_in_one_line():
    from tests.helpers import cli_in_process

    fsdp2 = ("use_torch_fsdp2=true", "untie_embeddings_and_output_weights=true", "gradient_accumulation_fusion=false")
    result = cli_in_process("config", "validate", _example(), "primus.sanitize_nan_grads=true", *fsdp2)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1
    assert "modules.pre_trainer.primus.sanitize_nan_grads: True cannot be honoured with use_torch_fsdp2" in lines[0]
    assert cli_in_process("config", "validate", _example(), "primus.sanitize_nan_grads=true").returncode == 0


@pytest.mark.parametrize("example", ["torchtitan/llama3_tiny-pretrain.yaml", "nemo_automodel/wan2_2_tiny-cpu.yaml"])
def test_a_backend_without_megatron_cores_buckets_refuses_the_switch_in_one_line(example):
    from tests.conftest import ROOT
    from tests.helpers import cli_in_process

    path = str(ROOT / "examples" / example)
    result = cli_in_process("config", "validate", path, "primus.sanitize_nan_grads=true")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "modules.pre_trainer.primus.sanitize_nan_grads: True: zeroes NaN/Inf gradient elements" in lines[0]
    assert "has no such step" in lines[0]
    assert cli_in_process("config", "validate", path, "primus.sanitize_nan_grads=false").returncode == 0


STEPS = 3  # the `runs` fixture's train_iters


@pytest.mark.e2e
def test_a_run_with_the_switch_applies_the_patch_and_trains_as_without_it(runs):
    """Through the real worker: the run's Patcher applies it (debug.log), and finite gradients are left as they are."""
    plain = runs("plain", 1)
    sanitized = runs("sanitized", 1, primus={"sanitize_nan_grads": True})
    assert [r["loss"] for r in sanitized] == [r["loss"] for r in plain]
    assert [r["grad_norm"] for r in sanitized] == [r["grad_norm"] for r in plain]
    debug = (runs.root / "sanitized" / "logs" / "pre_trainer" / "rank-0" / "debug.log").read_text()
    assert "megatron patch applied: sanitize_nan_grads: " in debug
    plain_debug = (runs.root / "plain" / "logs" / "pre_trainer" / "rank-0" / "debug.log").read_text()
    assert "megatron patch not applied: sanitize_nan_grads: not needed" in plain_debug
    assert "NaN/Inf gradient elements" not in (runs.root / "sanitized" / "output.log").read_text()
