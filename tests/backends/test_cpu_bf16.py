"""bf16 on CPU (issue #17): kept where the CPU has bf16 units, else fp32 with one derived line,
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
    from primus.backends.nemo_automodel.config import build_handoff

    derived = []
    params = {"model": {"compute_dtype": "bfloat16", "pretrained_model_name_or_path": "/nonexistent/pipeline"}}
    handoff = build_handoff(params, stage="pretrain", checkpoint_dir=Path("ckpt"), resume=False, dist_backend="gloo",
                            log_derived=lambda *d: derived.append(d), log=lambda msg: None)
    dtype = handoff.automodel["model"]["compute_dtype"]
    lines = [d for d in derived if d[0] == "model.compute_dtype"]
    if cpu == "native":
        assert dtype == "bfloat16" and not lines
    else:
        assert dtype == "float32" and len(lines) == 1 and "no native bf16" in lines[0][2]
