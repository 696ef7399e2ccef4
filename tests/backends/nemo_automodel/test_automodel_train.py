"""The real TrainDiffusionRecipe on a tiny two-expert Wan 2.2, driven through AutoModelAdapter."""
from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest

from tests.helpers import read_events, read_metrics, refused_in_process, train_in_process, train_with_torchrun

pytestmark = pytest.mark.e2e


def run_adapter(params: dict, stage: str, run_dir: Path, resume: bool = False) -> list[dict]:
    """One rank through the real worker (``train_worker``), in this process."""
    return train_in_process(run_dir, "nemo_automodel", params, stage=stage, resume=resume)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_train_alias_pretrains_and_reports_every_step(tiny_params, tmp_path):
    stage, params = tiny_params()
    assert stage == "pretrain"
    metrics = run_adapter(params, "train", tmp_path)
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["samples_per_sec"] > 0 and math.isfinite(m["loss"]) for m in metrics)
    assert all(m["extra"]["micro_batches"] == 2 for m in metrics)  # global 2 / local 1 on 1 rank
    assert list((tmp_path / "checkpoints").glob("epoch_*_step_1"))  # under the run dir, not AutoModel's


@pytest.mark.parametrize("expert,trained,other", [("high_noise", "transformer", "transformer_2"),
                                                   ("low_noise", "transformer_2", "transformer")])
def test_finetune_trains_only_the_chosen_expert(tiny_params, tiny_root, tmp_path, expert, trained, other):
    from safetensors.torch import load_file

    pipe = tiny_root / "pipeline"
    before = {name: _digest(pipe / name / "diffusion_pytorch_model.safetensors") for name in (trained, other)}
    _, params = tiny_params(model={"stage": expert, "pipeline_spec": {"subfolder": "ignored"}},
                            step_scheduler={"max_steps": 1, "ckpt_every_steps": 1},
                            checkpoint={"save_consolidated": True})
    metrics = run_adapter(params, "finetune", tmp_path)
    assert [m["step"] for m in metrics] == [1]
    saved = load_file(next((tmp_path / "checkpoints").glob("*/model/consolidated/model-*.safetensors")))
    start = load_file(pipe / trained / "diffusion_pytorch_model.safetensors")
    rival = load_file(pipe / other / "diffusion_pytorch_model.safetensors")
    key = "blocks.0.attn1.to_q.weight"
    step = (saved[key] - start[key]).abs().max().item()
    assert 0 < step < 1e-2, f"{trained} should move by about one AdamW step (lr 1e-4), moved {step}"
    assert (saved[key] - rival[key]).abs().max().item() > 0.05  # a different random init: not the rival
    assert {n: _digest(pipe / n / "diffusion_pytorch_model.safetensors") for n in before} == before


def test_unsupported_stage_lists_the_supported_ones(tiny_params, tmp_path):
    _, params = tiny_params()
    assert "TrainDiffusionRecipe supports stages pretrain, finetune" in refused_in_process(
        tmp_path, "nemo_automodel", params, stage="sft")


def test_checkpoint_resume_continues_from_saved_step(tiny_params, tmp_path):
    _, params = tiny_params(step_scheduler={"max_steps": 2, "ckpt_every_steps": 2, "num_epochs": 4})
    assert [m["step"] for m in run_adapter(params, "pretrain", tmp_path)] == [1, 2]
    # a fresh start would silently resume: refused
    assert "already exists" in refused_in_process(tmp_path, "nemo_automodel", params)
    params["step_scheduler"]["max_steps"] = 4
    metrics = run_adapter(params, "pretrain", tmp_path, resume=True)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]  # metrics.jsonl appends: 3, 4 come from the resumed run


def test_two_ranks_fsdp2_over_gloo_and_the_step_hooks_time_each_rank(tiny_params, tmp_path):
    """Rank 1's forward+backward made four times as long (slow@rank1:x4: a margin no loaded host's noise
    hides, on steps of a few hundredths of a second): the step hooks' phases name it."""
    _, params = tiny_params(step_scheduler={"max_steps": 3, "ckpt_every_steps": 3},
                            primus={"stragglers": {"interval": 3}})
    proc = train_with_torchrun(tmp_path / "run", "nemo_automodel", params, nproc=2,
                               env={"PRIMUS_FAULT_INJECT": "slow@rank1:x4"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert all((tmp_path / "run" / "logs" / "pre_trainer" / f"rank-{r}" / "info.log").exists() for r in (0, 1))
    metrics = read_metrics(tmp_path / "run")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["extra"]["micro_batches"] == 1 for m in metrics)  # dp=2: one micro-batch per rank
    assert all(m["samples_per_sec_per_gpu"] * 2 == pytest.approx(m["samples_per_sec"]) for m in metrics)
    [ranks] = read_events(tmp_path / "run", "ranks")  # steps 2-3 (the first step is left out)
    assert ranks["steps"] == [2, 3] and all(c > 0 for c in ranks["compute"]) and all(o > 0 for o in ranks["optimizer"])
    assert ranks["compute"][1] > 1.5 * ranks["compute"][0]
    assert [(s["rank"], s["phase"]) for s in read_events(tmp_path / "run", "straggler")] == [(1, "compute")]
    [worker] = read_events(tmp_path / "run", "worker")  # rank 0's save at step 3, timed for the goodput
    assert worker["checkpoint_s"] > 0


@pytest.mark.parametrize("caption_format", ["meta_json", "csv", "txt"])
def test_preprocessed_clips_train(tiny_params, tiny_root, tmp_path, caption_format):
    from primus.data.diffusion.preprocess import PreprocessConfig, preprocess
    from primus.data.diffusion.tiny import write_synthetic_clips

    videos = write_synthetic_clips(tmp_path / "videos", caption_format, n=2)
    cfg = PreprocessConfig(videos=videos, pipeline=tiny_root / "pipeline", output=tmp_path / "cache",
                           height=64, width=64, num_frames=9, progress=False)
    assert preprocess(cfg) == {"encoded": 2, "skipped_existing": 0, "skipped_short": 0}
    assert preprocess(cfg)["skipped_existing"] == 2  # resumable: nothing re-encoded
    _, params = tiny_params(data={"dataloader": {"cache_dir": str(tmp_path / "cache")}},
                            step_scheduler={"max_steps": 1, "ckpt_every_steps": 1}, checkpoint={"enabled": False})
    metrics = run_adapter(params, "finetune", tmp_path / "run")
    assert len(metrics) == 1 and math.isfinite(metrics[0]["loss"])
