"""``ckpt_format: torch``: Megatron-LM's legacy per-rank checkpoints, saved and loaded (TP=2 x PP=2, 4 CPU ranks).

A run saves ``iter_N/mp_rank_TT_PPP/model_optim_rng.pt`` and resumes from it on the uninterrupted
curve; a checkpoint written as Megatron-LM writes it on a GPU (``megatron_lm_legacy_writer.py``:
megatron-core's state dict under Transformer Engine's names, Megatron-LM's ``args``, CUDA RNG
states, no optimizer) loads and computes the loss the saving run computed.
"""
from __future__ import annotations

import argparse
import decimal
import json

import pytest

from primus.config.errors import ConfigError
from tests.backends.megatron.conftest import losses, run_megatron
from tests.helpers import torchrun_module

pytest.importorskip("megatron.core")
torch = pytest.importorskip("torch")

STEPS = 4
LAYOUT = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2}
LEGACY = {**LAYOUT, "ckpt_format": "torch", "save_interval": 2}


@pytest.mark.e2e
def test_tp2_pp2_saves_megatron_lm_layout_and_resumes_on_the_same_curve(runs):
    full = runs("legacy", 4, **LEGACY)
    iteration = runs.root / "legacy" / "checkpoints" / "iter_0000002"
    assert sorted(p.name for p in iteration.iterdir()) == ["mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000",
                                                          "mp_rank_01_001"]
    assert all((p / "model_optim_rng.pt").is_file() for p in iteration.iterdir())
    assert not list(iteration.rglob(".metadata"))  # not torch_dist
    resumed = runs("legacy_resumed", 4, resume_from=("legacy", 2), **LEGACY)
    assert [r["step"] for r in resumed] == [3, 4]
    assert losses(resumed) == pytest.approx(losses(full)[2:], abs=1e-5)
    assert [r["lr"] for r in resumed] == pytest.approx([r["lr"] for r in full[2:]])


@pytest.mark.e2e
def test_distributed_optimizer_state_resumes_from_distrib_optim_pt(runs):
    """DP=2 with use_distributed_optimizer: the Adam shards are gathered into distrib_optim.pt and scattered
    back (needs patch_distrib_optimizer_legacy_load_with_torch_adam without TE / Apex)."""
    options = {"ckpt_format": "torch", "use_distributed_optimizer": True, "save_interval": 2}
    full = runs("legacy_dp2", 2, **options)
    assert (runs.root / "legacy_dp2" / "checkpoints" / "iter_0000002" / "mp_rank_00" / "distrib_optim.pt").is_file()
    resumed = runs("legacy_dp2_resumed", 2, resume_from=("legacy_dp2", 2), **options)
    assert losses(resumed) == pytest.approx(losses(full)[2:], abs=1e-5)


@pytest.mark.e2e
def test_a_checkpoint_in_megatron_lm_own_layout_loads_and_gives_the_same_loss(runs, base, tmp_path):
    full = runs("legacy", 4, **LEGACY)
    params = tmp_path / "params.json"
    params.write_text(json.dumps({**base, **LAYOUT}))
    written = tmp_path / "megatron_lm"
    writer = torchrun_module("megatron", 4, "tests.backends.megatron.megatron_lm_legacy_writer",
                             runs.root / "legacy" / "checkpoints" / "iter_0000002", written, params)
    assert writer.returncode == 0, writer.stderr[-3000:]
    model = torch.load(written / "iter_0000002" / "mp_rank_00_000" / "model_optim_rng.pt", weights_only=False)["model"]
    assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in model  # Megatron-LM's GPU names
    assert "decoder.layers.0.input_layernorm.weight" not in model

    loaded = run_megatron(tmp_path / "run", {**base, **LAYOUT, "load": str(written), "no_load_optim": True,
                                             "train_iters": 3}, nproc=4)
    assert [r["step"] for r in loaded] == [3]  # iteration 2 and the data position from args.consumed_train_samples
    assert loaded[0]["loss"] == pytest.approx(full[2]["loss"], abs=1e-6)  # the same weights, the same batch
    log = (tmp_path / "run" / "output.log").read_text()
    assert "Megatron-LM's legacy checkpoint layout" in log
    assert "_extra_state entries" in log  # TE's FP8 metadata: nothing here keeps it
    assert "rng_tracker_states" in log  # CUDA generators on a CPU run: this run keeps its own streams


# ---------------------------------------------------------------- the pieces, without ranks

def test_rank_directories_are_named_as_megatron_lm_names_them():
    from primus.backends.megatron.legacy_checkpoint import rank_dir_name

    assert rank_dir_name(0) == "mp_rank_00"  # no pipeline, no experts
    assert rank_dir_name(1, 2) == "mp_rank_01_002"
    assert rank_dir_name(0, None, 3) == "mp_rank_00_003"  # experts without a pipeline
    assert rank_dir_name(1, 2, 3) == "mp_rank_01_002_003"


def test_a_checkpoint_of_another_layout_is_one_line_naming_both_sizes(tmp_path):
    from primus.backends.megatron.legacy_checkpoint import check_layout

    saved = argparse.Namespace(num_layers=2, hidden_size=64, num_attention_heads=4, tensor_model_parallel_size=2,
                               pipeline_model_parallel_size=1)
    run = argparse.Namespace(**{**vars(saved), "tensor_model_parallel_size": 1})
    check_layout({"args": saved, "checkpoint_version": 3.0}, saved, tmp_path)
    with pytest.raises(ConfigError, match="written with tensor_model_parallel_size=2, this run has 1 "
                                          r"\(legacy checkpoints are not resharded"):
        check_layout({"args": saved, "checkpoint_version": 3.0}, run, tmp_path / "model_optim_rng.pt")


def test_files_load_without_unpickling_arbitrary_objects(tmp_path):
    from primus.backends.megatron.legacy_checkpoint import read

    with pytest.raises(ConfigError, match="is missing"):
        read(tmp_path / "absent.pt")
    torch.save({"args": argparse.Namespace(lr=1.0), "model": {}}, tmp_path / "ok.pt")
    assert read(tmp_path / "ok.pt")["args"].lr == 1.0  # Megatron-LM's Namespace is a safe global
    torch.save({"args": decimal.Decimal(1)}, tmp_path / "foreign.pt")
    with pytest.raises(ConfigError) as refused:
        read(tmp_path / "foreign.pt")
    assert "Unsupported global: GLOBAL decimal.Decimal" in str(refused.value) and "\n" not in str(refused.value)


def test_model_keys_are_strict_but_te_fp8_metadata_is_dropped(tmp_path):
    from primus.backends.megatron.legacy_checkpoint import model_state_for

    module = torch.nn.Linear(2, 2)
    notes = []
    saved = {"weight": torch.ones(2, 2), "bias": torch.zeros(2), "core_attention._extra_state": b""}
    state = model_state_for(module, saved, tmp_path / "f.pt", lambda *note: notes.append(note))
    assert set(state) == {"weight", "bias"} and notes and "1 _extra_state entries" in notes[0][1]
    with pytest.raises(ConfigError, match="1 missing .*'bias'.*1 unexpected .*'other'"):
        model_state_for(module, {"weight": torch.ones(2, 2), "other": torch.ones(1)}, tmp_path / "f.pt", print)


def test_a_release_checkpoint_is_found_as_megatron_lm_finds_it(tmp_path):
    """A converted model (tracker "release", directory release/): weights only, from iteration 0."""
    from primus.backends.megatron.checkpoint import _source, latest_iteration

    (tmp_path / "release" / "mp_rank_00").mkdir(parents=True)
    torch.save({"model": {}}, tmp_path / "release" / "mp_rank_00" / "model_optim_rng.pt")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("release\n")
    assert latest_iteration(tmp_path) == 0
    assert _source(tmp_path) == (tmp_path / "release", 0, True)
    (tmp_path / "release" / "mp_rank_00" / "model_optim_rng.pt").write_bytes(b"PK\x03\x04 cut")
    with pytest.raises(ConfigError, match="release/mp_rank_00/model_optim_rng.pt is damaged"):
        _source(tmp_path)
