"""bf16 on CPU: kept where the CPU has bf16 units, else fp32 with one derived line,
the same rule for TorchTitan, Megatron and AutoModel (``primus.plan.devices.cpu_bf16_decision``)."""
from pathlib import Path

import pytest

from primus.plan import devices


@pytest.fixture(params=["native", "emulated"])
def cpu(request, monkeypatch):
    monkeypatch.delenv(devices.CPU_BF16_ENV, raising=False)
    monkeypatch.setattr(devices, "cpu_bf16_native", lambda: "amx_bf16" if request.param == "native" else None)
    return request.param


def test_torchtitan_mixed_precision(cpu):
    pytest.importorskip("torchtitan")
    from primus.backends.torchtitan.patches import apply_patches

    apply_patches()
    from primus.backends.torchtitan.config import build_trainer_config

    model = {"n_layers": 2, "dim": 64, "n_heads": 4, "vocab_size": 256}
    cfg, _, derived = build_trainer_config({"model": model, "training": {"mixed_precision_param": "bfloat16"}},
                                           run_dir=Path("."), device="cpu")
    lines = [d for d in derived if d[0] == "training.mixed_precision_param"]
    if cpu == "native":
        assert cfg.training.mixed_precision_param == "bfloat16" and not lines  # honoured, nothing derived
    else:
        assert cfg.training.mixed_precision_param == "float32"
        assert len(lines) == 1 and "no native bf16" in lines[0][2]
    fp32, _, derived = build_trainer_config({"model": model, "training": {"mixed_precision_param": "float32"}},
                                            run_dir=Path("."), device="cpu")
    assert fp32.training.mixed_precision_param == "float32" and not [d for d in derived if "precision" in d[0]]


def test_automodel_compute_dtype(cpu):
    from primus.backends.nemo_automodel.config import build_handoff, from_pipeline_spec
    from primus.runtime.adapter import CheckpointSpec, EnginePlan, ModuleConfig

    params = {"model": {"compute_dtype": "bfloat16", "pretrained_model_name_or_path": "/nonexistent/pipeline"}}
    plan = EnginePlan(ModuleConfig("pre_trainer", "nemo_automodel", "pretrain", params), None, 1, None,
                      CheckpointSpec(Path("ckpt")))
    cfg = build_handoff(params, mode="pretrain", weights=from_pipeline_spec, checkpoint_dir=Path("ckpt"), dist_backend="gloo", plan=plan)
    lines = [d for d in plan.derived if d.key == "model.compute_dtype"]
    if cpu == "native":
        assert cfg["model"]["compute_dtype"] == "bfloat16" and not lines
    else:
        assert cfg["model"]["compute_dtype"] == "float32" and len(lines) == 1 and "no native bf16" in lines[0].reason


def test_megatron_bf16(cpu):
    pytest.importorskip("megatron.core")
    from primus.backends.megatron.adapter import MegatronAdapter
    from primus.runtime.adapter import ModuleConfig

    params = {"model": {"n_layers": 2, "dim": 64, "n_heads": 4, "vocab_size": 256}, "bf16": True,
              "micro_batch_size": 1, "global_batch_size": 1, "seq_length": 32, "train_iters": 4, "lr": 1e-3,
              "mock_data": True}
    plan = MegatronAdapter().plan(ModuleConfig("pre_trainer", "megatron", "pretrain", params), 1, device="cpu")
    lines = [d for d in plan.derived if d.key == "bf16"]
    if cpu == "native":
        assert plan.engine_config.bf16 and not lines
    else:
        assert not plan.engine_config.bf16 and len(lines) == 1 and "no native bf16" in lines[0].reason


def test_torchtitan_moe_experts_stay_bf16_in_an_fp32_run_and_a_line_says_so():
    """TorchTitan 0.3.0's GroupedExperts casts to bf16 for its grouped GEMMs whatever the mixed precision."""
    pytest.importorskip("torchtitan")
    from primus.backends.torchtitan.patches import apply_patches

    apply_patches()
    from primus.backends.torchtitan.config import build_trainer_config

    fp32 = {"mixed_precision_param": "float32"}
    _, _, derived = build_trainer_config({"model": {"name": "deepseek_v3", "flavor": "debugmodel"}, "training": fp32},
                                         run_dir=Path("."), device="cpu")
    lines = [d for d in derived if d[0] == "training.mixed_precision_param"]
    assert len(lines) == 1 and lines[0][1] == "float32 (routed experts: bf16)" and "GroupedExperts" in lines[0][2]
    _, _, dense = build_trainer_config({"model": {"n_layers": 2, "dim": 64, "n_heads": 4, "vocab_size": 256},
                                        "training": fp32}, run_dir=Path("."), device="cpu")
    assert not [d for d in dense if d[0] == "training.mixed_precision_param"]
