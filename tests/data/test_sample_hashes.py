"""``primus: {sample_hashes: true}``: a digest of each step's global batch in metrics.jsonl, and what it
proves: a run stopped by SIGTERM at a random step and resumed consumes exactly the samples, in the
same order, of the run that was never stopped (Megatron's indexed dataset, TorchTitan's HF
dataloader whose state rides in the checkpoint), with the same loss curve (fp32)."""
from __future__ import annotations

import random

import pytest
import torch

from primus.runtime.sample_hash import BatchDigest, sample_digest
from tests.conftest import ROOT, TINY_EXAMPLE
from tests.helpers import read_metrics, train_in_workspace

MEGATRON = ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml"
AUTOMODEL_SFT = ROOT / "examples" / "nemo_automodel" / "llama3_tiny-sft-lora.yaml"
AUTOMODEL_WAN = ROOT / "examples" / "nemo_automodel" / "wan2_2_tiny-cpu.yaml"
# Megatron's one configuration for both its resume tests (stopped at a random step on 1 rank; on 2 ranks at
# step 3, resumed on 1): they compare against one uninterrupted run.
MEGATRON_RUN = ["primus.sample_hashes=true", "train_iters=6", "save_interval=100", "eval_interval=100"]


def test_the_hash_follows_the_samples_and_their_global_order():
    batch = torch.arange(24).reshape(6, 4)

    def hashed(parts):
        digest = BatchDigest()
        for keys, rows in parts:
            digest.add(rows, keys=keys)
        return digest.finish()

    whole = hashed([(range(6), batch)])
    assert hashed([([3, 4, 5], batch[3:]), ([0, 1, 2], batch[:3])]) == whole  # split and fed in any order
    assert hashed([(range(6), batch), ([0, 1], batch[:2])]) == whole  # a rank feeding the same samples again
    assert hashed([(range(6), batch.flip(0))]) != whole  # the same samples in another order
    changed = batch.clone()
    changed[5, 3] += 1
    assert hashed([(range(6), changed)]) != whole
    digest = BatchDigest(rank=1)
    digest.add(batch[:2])
    digest.add(batch[2:])
    assert digest.finish() == hashed([([(1, i) for i in range(6)], batch)])  # no global key: (rank, arrival)
    assert digest.finish() == BatchDigest().finish()  # each step starts empty
    dealt = [BatchDigest(rank) for rank in (0, 1)]  # a round-robin loader at degree 2: rank r fed rows r, r + 2, ...
    for rank, rank_digest in enumerate(dealt):
        rank_digest.add(batch[rank::2][:2], group_rank=rank, dealt_over=2)  # two micro-batches
        rank_digest.add(batch[rank::2][2:], group_rank=rank, dealt_over=2)
    gathered = {key: value for rank_digest in dealt for key, value in rank_digest._samples.items()}
    assert [gathered[key] for key in sorted(gathered)] == [sample_digest(row) for row in batch]  # the global order


@pytest.fixture(scope="module")
def straight(tmp_path_factory, tiny_cache):
    """``straight(example, overrides)``: the workspace of the uninterrupted run ``exp_name=straight`` of that
    configuration, trained once for the module (the tests only read it)."""
    trained = {}

    def run(example, overrides):
        key = (example, tuple(sorted(overrides)))
        if key not in trained:
            trained[key] = train_in_workspace(tmp_path_factory.mktemp("straight"), tiny_cache, example, "straight",
                                              *overrides)
        return trained[key]

    return run


def _hashes_and_losses(workspace, name):
    rows = read_metrics(workspace / "amd" / "root" / name)
    return [(r["step"], r["sample_hash"]) for r in rows], [r["loss"] for r in rows]


def _straight_and_resumed(run_primus, workspace, straight, example, overrides, steps, distinct=None):
    stop = random.randint(2, steps - 2)
    straight_workspace = straight(example, ["primus.sample_hashes=true", *overrides])
    first = run_primus("train", example, "exp_name=split", "primus.sample_hashes=true", *overrides,
                       env={"PRIMUS_FAULT_INJECT": f"term@rank0:step{stop}"})
    assert first.returncode == 75, first.stderr[-2000:]
    second = run_primus("train", example, "exp_name=split", "primus.sample_hashes=true", *overrides)
    assert second.returncode == 0, second.stderr[-2000:]
    hashes, losses = _hashes_and_losses(straight_workspace, "straight")
    split_hashes, split_losses = _hashes_and_losses(workspace, "split")
    assert [step for step, _ in hashes] == list(range(1, steps + 1))
    assert len({h for _, h in hashes}) >= (distinct or steps)  # by default every step a batch of its own
    assert split_hashes == hashes, f"stopped at step {stop}"
    assert split_losses == pytest.approx(losses, abs=1e-6), f"stopped at step {stop}"


@pytest.mark.e2e
def test_megatron_resume_consumes_the_same_samples(run_primus, workspace, straight):
    pytest.importorskip("megatron.core")
    _straight_and_resumed(run_primus, workspace, straight, MEGATRON, MEGATRON_RUN[1:], 6)


@pytest.mark.e2e
def test_torchtitan_resume_consumes_the_same_samples(run_primus, workspace, straight):
    pytest.importorskip("torchtitan")
    _straight_and_resumed(run_primus, workspace, straight, TINY_EXAMPLE,
                          ["training.steps=8", "checkpoint.interval=100"], 8)


@pytest.mark.e2e
def test_automodel_sft_resume_consumes_the_same_samples(run_primus, workspace, straight):
    """AutoModel's LLM recipe (LoRA, fp32 on CPU): its StatefulDataLoader state rides in the checkpoint."""
    pytest.importorskip("nemo_automodel")
    _straight_and_resumed(run_primus, workspace, straight, AUTOMODEL_SFT,
                          ["step_scheduler.max_steps=6", "step_scheduler.val_every_steps=100",
                           "step_scheduler.ckpt_every_steps=100"], 6)


@pytest.mark.e2e
def test_automodel_wan_resume_consumes_the_same_latents(run_primus, workspace, straight):
    """AutoModel's diffusion recipe (fp32 on CPU), 4 clips: 2 steps an epoch, the run spans 3 epochs (an
    epoch's pair of clips may come again in a later one). Its flow-matching noise and timesteps come from the
    global RNG: the losses match only with ``restored_loader_keeps_the_rng``."""
    pytest.importorskip("nemo_automodel")
    _straight_and_resumed(run_primus, workspace, straight, AUTOMODEL_WAN,
                          ["step_scheduler.max_steps=6", "step_scheduler.num_epochs=3",
                           "step_scheduler.ckpt_every_steps=100"], 6, distinct=2)


def _two_ranks_resumed_on_one(run_primus, workspace, straight, example, overrides, steps):
    """A 1-rank run, and a 2-rank run stopped at step 3 and resumed on 1 rank: same hashes, losses to 1e-5
    (the gradient reduction sums in another order)."""
    straight_workspace = straight(example, overrides)
    first = run_primus("train", example, "--nproc-per-node", "2", "exp_name=split", *overrides,
                       env={"PRIMUS_FAULT_INJECT": "term@rank0:step3"})
    assert first.returncode == 75, first.stderr[-2000:]
    second = run_primus("train", example, "exp_name=split", *overrides)
    assert second.returncode == 0, second.stderr[-2000:]
    hashes, losses = _hashes_and_losses(straight_workspace, "straight")
    split_hashes, split_losses = _hashes_and_losses(workspace, "split")
    assert [step for step, _ in hashes] == list(range(1, steps + 1)) and len({h for _, h in hashes}) == steps
    assert split_hashes == hashes
    assert split_losses == pytest.approx(losses, abs=1e-5)


@pytest.mark.e2e
def test_megatron_keeps_the_global_sample_order_when_resumed_on_fewer_ranks(run_primus, workspace, straight):
    """2 data-parallel ranks stopped at step 3, resumed on 1: the global batches of the 1-rank run."""
    pytest.importorskip("megatron.core")
    _two_ranks_resumed_on_one(run_primus, workspace, straight, MEGATRON, MEGATRON_RUN, 6)


@pytest.mark.e2e
def test_torchtitan_reshardable_keeps_the_global_sample_order_when_resumed_on_fewer_ranks(run_primus, workspace,
                                                                                          straight):
    """dataloader.reshardable: 2 FSDP ranks stopped at step 3, resumed on 1 (global batch 8 both ways: one
    micro-batch of 4 per rank, or two on the one rank): the global batches of the 1-rank run. Without
    reshardable the resume is refused before any rank starts (tests/backends/torchtitan/test_reshard.py)."""
    pytest.importorskip("torchtitan")
    _two_ranks_resumed_on_one(run_primus, workspace, straight, TINY_EXAMPLE,
                              ["primus.sample_hashes=true", "dataloader.reshardable=true", "training.steps=6",
                               "training.global_batch_size=8", "training.local_batch_size=4", "checkpoint.interval=100"], 6)


@pytest.mark.e2e
def test_automodel_refuses_to_resume_on_fewer_data_parallel_ranks(run_primus, workspace):
    """AutoModel keeps one dataloader state per data-parallel rank and loads the file of its own rank: 2 ranks
    stopped at step 2 and resumed on 1 would repeat half the consumed samples. Refused in one line before
    any rank starts (``nemo_automodel/resume.py``)."""
    pytest.importorskip("nemo_automodel")
    overrides = ["step_scheduler.max_steps=4", "step_scheduler.num_epochs=2", "step_scheduler.ckpt_every_steps=100"]
    first = run_primus("train", AUTOMODEL_WAN, "--nproc-per-node", "2", "exp_name=split", *overrides,
                       env={"PRIMUS_FAULT_INJECT": "term@rank0:step2"})
    assert first.returncode == 75, first.stderr[-2000:]
    run_dir = workspace / "amd" / "root" / "split"
    [saved] = [p for p in (run_dir / "checkpoints").glob("epoch_*_step_*") if (p / "dataloader").is_dir()]
    assert sorted(f.name for f in (saved / "dataloader").iterdir()) == \
        ["dataloader_dp_rank_0.pt", "dataloader_dp_rank_1.pt"]
    refused = run_primus("train", AUTOMODEL_WAN, "exp_name=split", *overrides)
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("primus: error: resume: ") and \
        "holds the data positions of 2 data-parallel ranks, this run has 1" in lines[0], lines
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2]  # nothing ran
