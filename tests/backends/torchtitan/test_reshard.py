"""Resume a TorchTitan checkpoint at another layout: DCP reshards the model and optimizer (FSDP over
2 ranks -> 1 rank and back, replicated DP -> FSDP, TP2 -> FSDP2, FSDP2 -> TP2), and
``dataloader.reshardable`` gives every data-parallel degree one data order and one data position, so
the first step after the resume has the loss the uninterrupted run had at that step (fp32): within
1e-5 where the two layouts compute a step alike (data parallelism of any kind), within 1e-4 across
tensor parallelism, whose vocab-parallel loss and split matmuls move even an uninterrupted run's first
loss by ~4e-5 (measured: TP2 6.8595576 vs FSDP2 6.8595943 at step 1, same weights and data), while a
resume at the same layout reproduces the step exactly. TorchTitan's own per-rank data positions at
another degree are refused before any rank starts, in one line.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.helpers import cli_in_process, read_metrics, train_with_torchrun

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")

from tests.conftest import TINY_EXAMPLE  # noqa: E402

LLAMA = {"n_layers": 2, "dim": 128, "n_heads": 4, "n_kv_heads": 2, "multiple_of": 32, "vocab_size": 512,
         "max_seq_len": 256}
GLOBAL_BATCH, STEPS, SAVE = 8, 4, 2
LAYOUTS = {  # name -> (ranks, parallelism, data-parallel degree)
    "one": (1, {}, 1),
    "fsdp2": (2, {"data_parallel_shard_degree": -1}, 2),
    "tp2": (2, {"data_parallel_shard_degree": 1, "tensor_parallel_degree": 2}, 1),
    "ddp2": (2, {"data_parallel_replicate_degree": 2, "data_parallel_shard_degree": 1}, 2),
}
DATA_PARALLEL, ACROSS_TP = 1e-5, 1e-4  # the next step's loss: see the module's docstring
# The 1-rank source run checkpoints asynchronously: the async test's run, and one resharded resume more
# from an async checkpoint (the other sources save synchronously).
ASYNC_SOURCES = {"one"}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from primus.data.tiny_assets import ensure_tiny_assets

    root = tmp_path_factory.mktemp("tiny_llm")
    ensure_tiny_assets(root)
    return root


def _params(assets: Path, layout: str, async_mode: str = "disabled") -> dict:
    _, parallelism, dp = LAYOUTS[layout]
    return {"primus": {"tiny_assets": str(assets)}, "model": LLAMA, "parallelism": parallelism,
            "optimizer": {"lr": 1e-3}, "debug": {"seed": 42}, "dataloader": {"reshardable": True},
            "checkpoint": {"enable": True, "interval": SAVE, "async_mode": async_mode},
            "training": {"steps": STEPS, "local_batch_size": GLOBAL_BATCH // dp, "seq_len": 64}}


@pytest.fixture(scope="module")
def runs(assets, tmp_path_factory):
    """layout -> metrics of an uninterrupted run (launched once); ``resumed(source, layout)`` -> the metrics of a
    run at ``layout`` from the source run's ``step-2``."""
    root = tmp_path_factory.mktemp("torchtitan_reshard")
    cache: dict[str, list[dict]] = {}

    def run(name: str, layout: str, resume_from: str | None = None, async_mode: str = "disabled") -> list[dict]:
        if name not in cache:
            run_dir = root / name
            if resume_from is not None:
                assert resume_from in cache, f"run {resume_from} first"
                shutil.copytree(root / resume_from / "checkpoints" / f"step-{SAVE}",
                                run_dir / "checkpoints" / f"step-{SAVE}")
            result = train_with_torchrun(run_dir, "torchtitan", _params(assets, layout, async_mode),
                                         nproc=LAYOUTS[layout][0], resume=resume_from is not None, timeout=600)
            assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
            cache[name] = read_metrics(run_dir)
        return cache[name]

    run.root = root
    return run


@pytest.mark.e2e
@pytest.mark.parametrize("source, target, tolerance", [
    ("fsdp2", "one", DATA_PARALLEL), ("one", "fsdp2", DATA_PARALLEL), ("ddp2", "fsdp2", DATA_PARALLEL),
    ("tp2", "fsdp2", ACROSS_TP), ("fsdp2", "tp2", ACROSS_TP)])
def test_the_next_step_after_a_resharded_resume_is_the_uninterrupted_step(runs, source, target, tolerance):
    full = runs(source, source, async_mode="async" if source in ASYNC_SOURCES else "disabled")
    resumed = runs(f"{source}_to_{target}", target, resume_from=source)
    assert [r["step"] for r in resumed] == list(range(SAVE + 1, STEPS + 1))
    # same weights, moments and data
    assert resumed[0]["loss"] == pytest.approx(full[SAVE]["loss"], abs=tolerance)
    # and the steps after it (each step adds the layouts' difference)
    assert [r["loss"] for r in resumed] == pytest.approx([r["loss"] for r in full[SAVE:]], abs=10 * tolerance)


@pytest.mark.e2e
def test_an_async_checkpoint_overlaps_training_and_resumes_like_a_synchronous_one(runs):
    """checkpoint.async_mode: async on CPU/gloo: DCP stages the state in memory and writes it from a thread
    while the next steps train; the step-2 checkpoint resumes to the uninterrupted step 3."""
    full = runs("one", "one", async_mode="async")
    log = (runs.root / "one" / "logs" / "pre_trainer" / "rank-0" / "info.log").read_text()
    assert "Staging the checkpoint." in log and "Finished staging the checkpoint" in log  # TorchTitan's async path
    assert (runs.root / "one" / "checkpoints" / f"step-{STEPS}" / ".metadata").exists()
    resumed = runs("one_to_one", "one", resume_from="one")
    assert resumed[0]["step"] == SAVE + 1 and resumed[0]["loss"] == pytest.approx(full[SAVE]["loss"], abs=1e-5)


def test_every_degree_trains_on_the_same_sequences_and_checkpoints_one_position(assets):
    """The reshardable order: step s holds sequences [s*G, (s+1)*G) at dp 1, 2 and 4; at a step boundary every
    rank's state is the same, and a dp=2 state resumes a dp=1 reader at the next global sequence."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from primus.backends.torchtitan.recipes.pretrain import register_local_datasets
    from primus.backends.torchtitan.data import PrimusTextDataLoader

    register_local_datasets()
    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(assets / "tokenizer"))

    def loader(dp: int, rank: int) -> PrimusTextDataLoader:
        config = PrimusTextDataLoader.Config(dataset="jsonl", dataset_path=str(assets / "corpus"), reshardable=True)
        return PrimusTextDataLoader(config, dp_world_size=dp, dp_rank=rank, tokenizer=tokenizer, seq_len=32,
                                    local_batch_size=GLOBAL_BATCH // dp)

    def steps(readers, n: int) -> list[set[bytes]]:
        iters = [iter(r) for r in readers]
        out = []
        for _ in range(n):
            out.append({row.numpy().tobytes() for it in iters for row in next(it)[0]["input"]})
        return out

    one = steps([loader(1, 0)], 3)
    assert all(len(batch) == GLOBAL_BATCH for batch in one)  # distinct sequences
    for dp in (2, 4):
        readers = [loader(dp, r) for r in range(dp)]
        assert steps(readers, 3) == one
        states = [r.state_dict() for r in readers]
        assert all(s == states[0] for s in states) and list(states[0]) == ["all_ranks"]
    two = [loader(2, r) for r in range(2)]
    steps(two, 2)
    single = loader(1, 0)
    single.load_state_dict(two[0].state_dict())
    assert steps([single], 1) == one[2:]


def _dcp_with_dataloader(path: Path, keys: list[str]) -> Path:
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.ones(4), "dataloader": {key: b"state" for key in keys}}, checkpoint_id=str(path))
    return path


def test_which_data_positions_a_run_can_load(tmp_path):
    from types import SimpleNamespace

    from primus.backends.torchtitan.data import dataloader_problem

    def cfg(reshardable: bool, shard: int = -1, tp: int = 1, exclude=()):
        parallelism = SimpleNamespace(data_parallel_replicate_degree=1, data_parallel_shard_degree=shard,
                                      tensor_parallel_degree=tp, pipeline_parallel_degree=1, context_parallel_degree=1)
        return SimpleNamespace(parallelism=parallelism, dataloader=SimpleNamespace(reshardable=reshardable),
                               checkpoint=SimpleNamespace(exclude_from_loading=list(exclude)))

    per_rank = _dcp_with_dataloader(tmp_path / "per_rank", ["dp_rank_0", "dp_rank_1", "world_size"])
    shared = _dcp_with_dataloader(tmp_path / "shared", ["all_ranks"])
    assert dataloader_problem(per_rank, cfg(False), 2) is None  # same degree
    assert dataloader_problem(per_rank, cfg(False, tp=2), 4) is None  # dp 2 again, with TP
    problem = dataloader_problem(per_rank, cfg(False), 1)
    assert "was written at data-parallel degree 2, this run's is 1: TorchTitan 0.3.0 keeps one data position per " \
           "data-parallel rank" in problem and "dataloader.reshardable: true writes checkpoints" in problem
    assert dataloader_problem(per_rank, cfg(False, exclude=["dataloader"]), 1) is None
    assert "which a reshardable loader cannot read" in dataloader_problem(per_rank, cfg(True), 2)
    assert dataloader_problem(shared, cfg(True), 1) is None and dataloader_problem(shared, cfg(True), 4) is None
    assert "set it again to resume" in dataloader_problem(shared, cfg(False), 2)


def test_another_data_parallel_degree_is_refused_before_any_rank_starts(tmp_path):
    """A run dir whose run stopped after a 2-rank FSDP checkpoint (TorchTitan's per-rank data positions),
    resumed on one rank: one line, exit 2, nothing written."""
    workspace = tmp_path / "ws"
    run_dir = workspace / "amd" / "root" / "refused"
    _dcp_with_dataloader(run_dir / "checkpoints" / "step-2", ["dp_rank_0", "dp_rank_1", "world_size"])
    (run_dir / "manifest.json").write_text(json.dumps({"status": "failed", "start_time": "x", "attempts": []}))
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    result = cli_in_process("train", TINY_EXAMPLE, "exp_name=refused", "training.steps=4",
                            env={**os.environ, "PRIMUS_WORKSPACE": str(workspace)})
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("primus: error: resume: ") and \
        "was written at data-parallel degree 2, this run's is 1" in lines[0], lines
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before
