"""Resume a Megatron checkpoint at another layout (``torch_dist`` resharding), optimizer state included:
the first step after the resume has the loss the uninterrupted run had at that step (fp32, 1e-5).
What megatron-core cannot reshard is refused before any rank starts, in one line (``reshard.py``).

The end-to-end pairs run the real worker on 1-2 CPU ranks; the refusals read checkpoint
directories built here with the files each format holds (a ``torch.save`` per legacy rank, a DCP
directory with the ``common.pt`` Primus writes).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.backends.megatron.conftest import losses
from tests.conftest import ROOT
from tests.helpers import cli_in_process

torch = pytest.importorskip("torch")

STEPS = 4
SAVE = 2
MOE = {"num_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 128, "moe_router_load_balancing_type": "aux_loss",
       "moe_aux_loss_coeff": 1e-2, "moe_router_dtype": "fp32", "moe_token_dispatcher_type": "alltoall"}
EXAMPLE = ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml"


def _next_step_matches(runs, source: tuple[str, int, dict], target: tuple[str, int, dict]):
    (name, nproc, options), (target_name, target_nproc, target_options) = source, target
    full = runs(name, nproc, save_interval=SAVE, **options)
    resumed = runs(target_name, target_nproc, resume_from=(name, SAVE), save_interval=SAVE, **target_options)
    assert [r["step"] for r in resumed] == list(range(SAVE + 1, STEPS + 1))
    assert resumed[0]["loss"] == pytest.approx(full[SAVE]["loss"], abs=1e-5)  # the next step: same weights, moments, data
    assert losses(resumed) == pytest.approx(losses(full)[SAVE:], abs=1e-4)
    assert [r["lr"] for r in resumed] == pytest.approx([r["lr"] for r in full[SAVE:]])
    return (runs.root / target_name / "output.log").read_text()


@pytest.mark.e2e
def test_tp2_dp1_resumes_at_tp1_dp2(runs):
    pytest.importorskip("megatron.core")
    log = _next_step_matches(runs, ("tp2", 2, {"tensor_model_parallel_size": 2}), ("tp2_to_dp2", 2, {}))
    assert "was written at TP2·PP1·EP1·DP1, this run is TP1·PP1·EP1·DP2: the RNG streams" in log


@pytest.mark.e2e
def test_pp2_resumes_at_pp1(runs):
    pytest.importorskip("megatron.core")
    _next_step_matches(runs, ("pp2", 2, {"pipeline_model_parallel_size": 2}), ("pp2_to_pp1", 1, {}))


@pytest.mark.e2e
def test_ep2_resumes_at_ep1(runs):
    """EP 2 -> 1 and DP 2 -> 1 on a Mixtral-style MoE: the experts' moments are resharded with their weights."""
    pytest.importorskip("megatron.core")
    _next_step_matches(runs, ("ep2", 2, {**MOE, "expert_model_parallel_size": 2}), ("ep2_to_ep1", 1, MOE))


def _legacy(root: Path, ranks: tuple[str, ...]) -> Path:
    iteration = root / "iter_0000002"
    for rank in ranks:
        (iteration / rank).mkdir(parents=True)
        torch.save({"iteration": 2}, iteration / rank / "model_optim_rng.pt")
    (root / "latest_checkpointed_iteration.txt").write_text("2")
    return iteration


def _torch_dist(root: Path, layout: dict, sharding: str | None = "dp_reshardable") -> Path:
    import torch.distributed.checkpoint as dcp

    iteration = root / "iter_0000002"
    dcp.save({"w": torch.ones(4)}, checkpoint_id=str(iteration))
    common = {"iteration": 2, "parallel_layout": layout}
    if sharding:
        common["content_metadata"] = {"distrib_optim_sharding_type": sharding}
    torch.save(common, iteration / "common.pt")
    (iteration / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    (root / "latest_checkpointed_iteration.txt").write_text("2")
    return iteration


def _layout(tp=1, pp=1, ep=1, distributed=False, world=None) -> dict:
    layout = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp, "expert_model_parallel_size": ep,
              "use_distributed_optimizer": distributed}
    if world:
        layout.update(world_size=world, data_parallel_size=world // (tp * pp))
    return layout


def test_what_reshards_and_what_does_not(tmp_path):
    from primus.backends.megatron.reshard import resume_problem, rng_restorable, saved_layout

    legacy = _legacy(tmp_path / "legacy", ("mp_rank_00", "mp_rank_01"))
    assert saved_layout(legacy)["rank_grid"] == [2]
    assert resume_problem(legacy, _layout(tp=2, world=4), load_optimizer=True) is None  # only DP changed
    problem = resume_problem(legacy, _layout(world=2), load_optimizer=True)
    assert "holds a 2 grid of mp_rank_* directories, this run's layout (TP1·PP1·EP1·DP2) reads a 1 grid" in problem
    plain = _torch_dist(tmp_path / "plain", _layout(tp=2, world=2), sharding=None)
    assert resume_problem(plain, _layout(pp=2, ep=2, world=4), load_optimizer=True) is None  # torch_dist reshards
    assert not rng_restorable(plain, _layout(world=2)) and rng_restorable(plain, _layout(tp=2, world=4))
    distributed = _torch_dist(tmp_path / "dist", _layout(tp=2, distributed=True, world=2))
    assert resume_problem(distributed, _layout(tp=2, distributed=True, world=4), load_optimizer=True) is None
    problem = resume_problem(distributed, _layout(distributed=True, world=2), load_optimizer=True)
    assert "its distributed-optimizer state (dp_reshardable) reshards over data parallelism only (TP 2 -> 1); " \
           "resume at TP2·PP1·EP1, or set no_load_optim: true" in problem
    assert resume_problem(distributed, _layout(distributed=True, world=2), load_optimizer=False) is None
    assert "holds the state of the distributed optimizer, this run uses the plain optimizer" in \
        resume_problem(distributed, _layout(tp=2, world=2), load_optimizer=True)


def test_a_checkpoint_without_the_record_names_its_tp_and_pp_by_its_rng_objects(tmp_path):
    import torch.distributed.checkpoint as dcp

    from primus.backends.megatron.reshard import saved_layout

    dcp.save({"rng_state/shard_0.1_2.2": torch.ones(1), "w": torch.ones(4)}, checkpoint_id=str(tmp_path))
    (tmp_path / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    assert saved_layout(tmp_path) == {"ckpt_format": "torch_dist", "pipeline_model_parallel_size": 2,
                                      "tensor_model_parallel_size": 2}


@pytest.mark.parametrize("kind", ["legacy", "distributed_optimizer"])
def test_a_layout_megatron_cannot_reshard_is_refused_before_any_rank_starts(tmp_path, kind):
    pytest.importorskip("megatron.core")
    source = tmp_path / "source"
    if kind == "legacy":
        _legacy(source, ("mp_rank_00", "mp_rank_01"))
        extra, expected = ["ckpt_format=torch"], "holds a 2 grid of mp_rank_* directories"
    else:
        _torch_dist(source, _layout(tp=2, distributed=True, world=2))
        extra, expected = ["use_distributed_optimizer=true"], "reshards over data parallelism only (TP 2 -> 1)"
    workspace = tmp_path / "ws"
    result = cli_in_process("train", EXAMPLE, f"load={source}", "exp_name=refused", *extra,
                            env={**os.environ, "PRIMUS_WORKSPACE": str(workspace)})
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("primus: error: resume: ") and expected in lines[0], lines
    assert not (workspace / "amd" / "root" / "refused").exists()  # nothing written, no rank started
