"""One neutral preset, two engines, the same initial embedding.

The benchmark finding this guards: with the 25M preset TorchTitan ended 10 steps at loss 1.64 and
Megatron at 4.12, because TorchTitan draws the token embedding from N(0, 1) and megatron-core from
N(0, init_method_std = 0.02). Both models are built here for real (megatron-core's GPTModel through
the backend's own builders, TorchTitan's Llama3Model from the backend's ModelSpec), in this process
under each engine's patches (a ``Patcher``, undone after the build; megatron-core on a one-rank group),
and their weights measured.
"""
from __future__ import annotations

import tempfile

import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("torchtitan")

SPEC = {"n_layers": 2, "dim": 64, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512, "max_seq_len": 128}



def _megatron(spec: dict):
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    from primus.backends.megatron.arguments import parse_args
    from primus.backends.megatron.model import Derived, build_model, transformer_config
    from primus.backends.megatron.patches import PATCHES
    from primus.runtime.patches import Patcher, Where

    with Patcher(PATCHES, Where.here(())):
        dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
        try:
            parallel_state.initialize_model_parallel()
            torch.manual_seed(1234)
            tensor_parallel.model_parallel_cuda_manual_seed(1234)
            args = parse_args({"model": spec, "seq_length": 64, "train_iters": 1, "lr": 1e-3, "mock_data": True,
                               "micro_batch_size": 1})
            config = transformer_config(args, on_gpu=False, derived=Derived())
            model = build_model(args, config, 512, use_te=False)[0]
            return {"embedding": model.embedding.word_embeddings.weight, "head": model.output_layer.weight}
        finally:
            tensor_parallel.get_cuda_rng_tracker().reset()
            parallel_state.destroy_model_parallel()
            dist.destroy_process_group()


def _torchtitan(spec: dict):
    import torch

    from primus.backends.torchtitan.model import build_model_spec
    from primus.backends.torchtitan.patches import PATCHES
    from primus.plan.model import ModelSpec
    from primus.runtime.patches import Patcher, Where

    with Patcher(PATCHES, Where.here(())):
        torch.manual_seed(42)
        model = build_model_spec(ModelSpec(**spec), "sdpa").model.build()
        model.init_weights()
        return {"embedding": model.tok_embeddings.weight, "head": model.lm_head.weight}


def weight_stds(engine: str, **neutral) -> dict[str, float]:
    build = _megatron if engine == "megatron" else _torchtitan
    return {k: float(v.detach().float().std()) for k, v in build({**SPEC, **neutral}).items()}


def test_engine_defaults_differ_without_the_neutral_key():
    """What a preset without ``embedding_init_std`` gets: each engine's own default."""
    titan, megatron = weight_stds("torchtitan"), weight_stds("megatron")
    assert titan["embedding"] == pytest.approx(1.0, rel=0.05)
    assert megatron["embedding"] == pytest.approx(0.02, rel=0.05)


@pytest.mark.parametrize("std", [1.0, 0.02])
def test_embedding_init_std_gives_both_engines_the_same_embedding(std):
    titan, megatron = weight_stds("torchtitan", embedding_init_std=std), weight_stds("megatron", embedding_init_std=std)
    assert titan["embedding"] == pytest.approx(std, rel=0.05)
    assert megatron["embedding"] == pytest.approx(std, rel=0.05)
    # The LM head stays each engine's own (no megatron-core knob for it): TorchTitan dim**-0.5
    # (truncated at 3 std), Megatron init_method_std.
    assert titan["head"] == pytest.approx(SPEC["dim"] ** -0.5, rel=0.1)
    assert megatron["head"] == pytest.approx(0.02, rel=0.05)
