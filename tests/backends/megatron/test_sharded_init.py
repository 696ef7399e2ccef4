"""Sharded initialisation on Megatron: megatron-core's CPU initialisation across tensor- and expert-parallel
ranks, compared with a one-rank initialisation of the same model, weight by weight."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import torchrun_module

pytest.importorskip("megatron.core")
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.e2e

DUMP = "tests.backends.megatron.init_dump"
MODEL = {"n_layers": 2, "dim": 64, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512, "max_seq_len": 64,
         "n_experts": 4, "top_k": 2, "moe_ffn_hidden_size": 128, "moe_layer_freq": [0, 1]}  # a dense and a MoE layer
BASE = {"model": MODEL, "seq_length": 64, "train_iters": 1, "lr": 1e-3, "mock_data": True, "micro_batch_size": 1}


def initial_weights(tmp_path: Path, nproc: int, without: str | None = None, **overrides) -> list[tuple[dict, dict]]:
    name = f"n{nproc}-" + "-".join(f"{k}{v}" for k, v in overrides.items()) + (f"-without-{without}" if without else "")
    params = tmp_path / f"{name}.json"
    params.write_text(json.dumps({**BASE, **overrides}))
    result = torchrun_module("megatron", nproc, DUMP, tmp_path / name, params, *(["--without", without] if without else []))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return [(torch.load(tmp_path / f"{name}.rank{r}.pt"), json.loads((tmp_path / f"{name}.rank{r}.json").read_text()))
            for r in range(nproc)]


def expert_index(key: str) -> int | None:
    return int(key.split("local_experts.")[1].split(".")[0]) if "local_experts." in key else None


def gather_experts(ranks, experts: int) -> dict:
    """Local expert j of EP rank r is global expert r * local + j."""
    local = experts // len(ranks)
    out = {}
    for state, where in ranks:
        for key, value in state.items():
            j = expert_index(key)
            if j is None:
                out.setdefault(key, value)
            else:
                out[key.replace(f"local_experts.{j}.", f"local_experts.{where['ep_rank'] * local + j}.")] = value
    return out


def gather_tensor_parallel(ranks, reference: dict) -> dict:
    """Concatenate TP shards along the dimension they were split on; a SwiGLU fc1 holds each rank's
    [gate_r; up_r] (megatron-core's stride 2), so gates and ups are joined separately."""
    out = {}
    shards = [state for state, _ in sorted(ranks, key=lambda r: r[1]["tp_rank"])]
    for key, full in reference.items():
        parts = [s[key] for s in shards]
        if parts[0].shape == full.shape:
            out[key] = parts[0]
            continue
        dim = next(d for d in range(full.dim()) if parts[0].shape[d] != full.shape[d])
        if "linear_fc1.weight" in key:
            halves = [p.chunk(2, dim=dim) for p in parts]
            out[key] = torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=dim)
        else:
            out[key] = torch.cat(parts, dim=dim)
    return out


def differing(a: dict, b: dict) -> list[str]:
    assert set(a) == set(b)
    return [k for k in a if not torch.equal(a[k], b[k])]


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory) -> list[tuple[dict, dict]]:
    """The one-rank initialisation both comparisons start from (built once)."""
    return initial_weights(tmp_path_factory.mktemp("one_rank"), 1)


def test_two_expert_parallel_ranks_initialise_the_one_rank_experts(tmp_path, one_rank):
    one = gather_experts(one_rank, 4)
    two = gather_experts(initial_weights(tmp_path, 2, expert_model_parallel_size=2), 4)
    assert differing(one, two) == []  # bit for bit, experts and everything built after them
    experts = [k for k in one if expert_index(k) is not None]
    assert len(experts) == 8  # 4 experts x (fc1, fc2) in the MoE layer


def test_without_the_patch_the_second_rank_repeats_the_first_ranks_experts(tmp_path):
    two = gather_experts(initial_weights(tmp_path, 2, without="patch_cpu_expert_init_across_ep_ranks",
                                         expert_model_parallel_size=2), 4)
    fc1 = "decoder.layers.1.mlp.experts.local_experts.{}.linear_fc1.weight"
    assert torch.equal(two[fc1.format(0)], two[fc1.format(2)])  # global expert 2 == expert 0: degenerate
    assert torch.equal(two[fc1.format(1)], two[fc1.format(3)])


def test_tensor_parallel_shards_are_slices_of_the_one_rank_weights(tmp_path, one_rank):
    one = one_rank[0][0]
    # MoE with TP needs sequence parallelism (megatron-core); it changes no initial weight
    two = gather_tensor_parallel(initial_weights(tmp_path, 2, tensor_model_parallel_size=2, sequence_parallel=True), one)
    assert differing(one, two) == []
