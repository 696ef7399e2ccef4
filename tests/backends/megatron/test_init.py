"""One neutral preset, two engines, the same initial embedding.

The benchmark finding this guards: with the 25M preset TorchTitan ended 10 steps at loss 1.64 and
Megatron at 4.12, because TorchTitan draws the token embedding from N(0, 1) and megatron-core from
N(0, init_method_std = 0.02). Both models are built here for real (megatron-core's GPTModel through
the backend's own builders, TorchTitan's Llama3Model from the backend's ModelSpec), each in a fresh
interpreter (process group, engine patches), and their weights measured.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.backends.megatron.conftest import REPO

pytestmark = pytest.mark.e2e  # every test here starts Primus or an engine in another process

pytest.importorskip("megatron.core")
pytest.importorskip("torchtitan")

SPEC = {"n_layers": 2, "dim": 64, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512, "max_seq_len": 128}

MEGATRON = """
    import os, tempfile
    import torch, torch.distributed as dist
    from primus.backends.megatron.patches import apply_patches
    apply_patches()
    from megatron.core import parallel_state, tensor_parallel
    from primus.backends.megatron.arguments import parse_args
    from primus.backends.megatron.model import Derived, build_model, transformer_config
    dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    torch.manual_seed(1234)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    args = parse_args({"model": SPEC, "seq_length": 64, "train_iters": 1, "lr": 1e-3, "mock_data": True,
                       "micro_batch_size": 1})
    config = transformer_config(args, on_gpu=False, derived=Derived())
    model = build_model(args, config, 512, use_te=False)[0]
    out = {"embedding": model.embedding.word_embeddings.weight, "head": model.output_layer.weight}
"""

TORCHTITAN = """
    from primus.backends.torchtitan.patches import apply_patches
    apply_patches()
    import torch
    from primus.backends.torchtitan.model import build_model_spec
    from primus.plan.model import ModelSpec
    torch.manual_seed(42)
    model = build_model_spec(ModelSpec(**SPEC), "sdpa").model.build()
    model.init_weights()
    out = {"embedding": model.tok_embeddings.weight, "head": model.lm_head.weight}
"""


def weight_stds(engine: str, **neutral) -> dict[str, float]:
    body = textwrap.dedent(MEGATRON if engine == "megatron" else TORCHTITAN)
    code = (f"import json, warnings; warnings.simplefilter('ignore')\nSPEC = {json.dumps({**SPEC, **neutral})}\n"
            f"{body}\nprint('STDS', json.dumps({{k: float(v.detach().float().std()) for k, v in out.items()}}))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(l for l in result.stdout.splitlines() if l.startswith("STDS "))
    return json.loads(line[len("STDS "):])


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
