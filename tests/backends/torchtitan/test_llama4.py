"""Llama 4 on TorchTitan's transformers backend: the same network as transformers' Llama4ForCausalLM."""
import math

import pytest
import torch

pytest.importorskip("torchtitan")
pytest.importorskip("transformers")

from primus.backends.torchtitan import llama4  # noqa: E402

SEQ = 32


@pytest.fixture(autouse=True)
def _restore_transformers_init():
    """TorchTitan's transformers backend replaces ``PreTrainedModel._init_weights`` (and
    ``_initialize_weights``) process-wide when it builds a model; later tests in this pytest process
    that load a Hugging Face model (AutoModel's LoRA export check) must get transformers' own."""
    from transformers.modeling_utils import PreTrainedModel

    saved = {name: PreTrainedModel.__dict__[name] for name in ("_init_weights", "_initialize_weights")
             if name in PreTrainedModel.__dict__}
    yield
    for name, value in saved.items():
        setattr(PreTrainedModel, name, value)


def _tiny_config(tmp_path, **overrides):
    from transformers import Llama4TextConfig

    kwargs = dict(vocab_size=256, hidden_size=64, intermediate_size=64, intermediate_size_mlp=128,
                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2, use_qk_norm=True,
                  attention_chunk_size=16, max_position_embeddings=16384, floor_scale=8, attn_scale=0.1,
                  rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                                   "original_max_position_embeddings": 8192})
    kwargs.update(overrides)
    config = Llama4TextConfig(**kwargs)
    config.architectures = ["Llama4ForCausalLM"]
    llama4.write_hf_config(tmp_path / "hf", llama4.config_json(config))
    return config


def _backend_model(tmp_path, config):
    """The model exactly as TorchTitan's trainer makes it: the spec Primus builds, update_from_config from
    hf_model, built on meta, materialised, ``init_states``."""
    from primus.backends.torchtitan.patches import apply_hf_backend_patches

    apply_hf_backend_patches()  # before any torchtitan import (CPU device, triton stub)
    from primus.backends.torchtitan.hooks import PrimusHFTrainer

    spec = llama4.titan_spec("debugmodel", config)
    trainer_config = PrimusHFTrainer.Config(model_spec=spec, hf_model=str(tmp_path / "hf"))
    trainer_config.training.seq_len = SEQ
    spec.model.update_from_config(config=trainer_config)
    with torch.device("meta"):
        model = spec.model.build()
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_states()
    return model


@pytest.mark.e2e
@pytest.mark.parametrize("interleave,qk_norm", [(2, True), (1, False)])
def test_logits_match_transformers_llama4(tmp_path, interleave, qk_norm):
    """MoE (sigmoid top-1 score on the expert input, shared expert), dense/MoE interleave, NoPE layer 3 with
    temperature tuning (floor_scale 8 < SEQ, so it acts), chunked attention (chunk 16 < SEQ), qk-norm."""
    from transformers import Llama4ForCausalLM
    from transformers.models.llama4.modeling_llama4 import Llama4TextRotaryEmbedding

    config = _tiny_config(tmp_path, interleave_moe_layer_step=interleave, use_qk_norm=qk_norm)
    model = _backend_model(tmp_path, config).eval()
    config._attn_implementation = "eager"
    with torch.device("meta"):  # no init at all (the backend patches PreTrainedModel's init process-wide)
        reference = Llama4ForCausalLM(config)
    weights = {key: value.clone() for key, value in model.model.state_dict().items()}
    reference.load_state_dict(weights, strict=True, assign=True)
    reference.model.rotary_emb = Llama4TextRotaryEmbedding(config)  # its buffers, as transformers computes them
    reference.eval()
    assert [type(layer.feed_forward).__name__ for layer in model.layers.values()] == \
        [type(layer.feed_forward).__name__ for layer in reference.model.layers]  # HF's own MoE blocks kept
    tokens = torch.randint(0, 256, (2, SEQ), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(SEQ).expand(2, SEQ)  # what TorchTitan's dataloader passes
    with torch.no_grad():
        ours = model(tokens, positions=positions)
        theirs = reference(tokens).logits
    diff = (ours - theirs).abs().max().item()
    print(f"max |logit diff| = {diff:.3e} (max |logit| {theirs.abs().max().item():.3f})")
    assert diff < 1e-4


def test_init_draws_router_experts_and_rope(tmp_path):
    """hf_backend_feed_forward_init / hf_backend_rope_buffers: no N(0, 1) experts, no empty router, RoPE on."""
    model = _backend_model(tmp_path, _tiny_config(tmp_path))
    moe = model.layers["1"].feed_forward
    assert 0.005 < moe.router.weight.std().item() < 0.03
    assert moe.experts.gate_up_proj.std().item() < 0.03 and moe.experts.down_proj.std().item() < 0.03
    rotary = model.model.model.rotary_emb
    assert rotary.inv_freq.abs().min().item() > 0


@pytest.mark.e2e
def test_chunked_layers_get_their_own_mask(tmp_path):
    model = _backend_model(tmp_path, _tiny_config(tmp_path))
    masks = model.get_attention_masks(torch.arange(SEQ).expand(1, SEQ))
    assert set(masks) == {"full_attention", "chunked_attention"}
    from torch.nn.attention.flex_attention import create_mask

    chunked = create_mask(masks["chunked_attention"].mask_mod, 1, None, SEQ, SEQ, device="cpu")[0, 0]
    assert chunked[20, 15].item() is False and chunked[20, 16].item() is True and chunked[15, 0].item() is True


@pytest.mark.parametrize("flavor,total,active", [("17bx16e", 109e9, 17e9), ("17bx128e", 400e9, 17e9)])
def test_flavors_match_the_published_sizes(flavor, total, active):
    """Scout 109B total / 17B active, Maverick 400B / 17B (Meta's model cards), within 2%."""
    counts = llama4.neutral_spec(llama4.text_config(flavor), flavor).param_counts()
    assert abs(counts.total / total - 1) < 0.02, counts
    assert abs(counts.active / active - 1) < 0.02, counts


@pytest.mark.e2e
def test_tiny_llama4_trains_on_cpu(tmp_path, tiny_cache):
    """The real TorchTitan trainer on the transformers backend, one rank (gloo), the learnable tiny corpus:
    TorchTitan's llama4 debugmodel cut to 4 layers (dense/MoE interleaved, layer 3 NoPE), chunk 32 < seq 64."""
    from primus.data.tiny_assets import ensure_tiny_assets
    from tests.helpers import read_metrics, train_with_torchrun

    ensure_tiny_assets(tiny_cache / "tiny_llm")

    params = {"model": {"name": "llama4", "flavor": "debugmodel", "n_layers": 4, "vocab_size": 512},
              "primus": {"tiny_assets": str(tiny_cache / "tiny_llm")}, "optimizer": {"lr": 2e-3},
              "lr_scheduler": {"warmup_steps": 2}, "debug": {"seed": 42},
              "training": {"steps": 12, "local_batch_size": 4, "seq_len": 64}}
    result = train_with_torchrun(tmp_path / "llama4", "torchtitan", params, nproc=1)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    metrics = read_metrics(tmp_path / "llama4")
    losses = [row["loss"] for row in metrics]
    print("losses", [round(loss, 3) for loss in losses])
    assert len(losses) == 12 and all(map(math.isfinite, losses))
    assert losses[-1] < 0.6 * losses[0], losses
    written = llama4.read_config(tmp_path / "llama4" / llama4.CONFIG_DIR / "config.json")
    assert written["model_type"] == "llama4_text" and written["num_hidden_layers"] == 4


def test_hf_backend_patches_are_named_and_gated():
    from primus.backends.torchtitan.patches import PATCHES, apply_hf_backend_patches

    names = {"hf_backend_feed_forward_sharding", "hf_backend_feed_forward_init", "hf_backend_rope_buffers",
             "hf_backend_chunked_attention_masks", "hf_backend_sdpa_on_cpu"}
    backend = [patch for patch in PATCHES if patch.name.startswith("hf_backend")]
    assert {patch.name for patch in backend} == names
    assert all(patch.why and str(patch.versions) and patch.when.needs_run for patch in backend)
    applied = {name for name in apply_hf_backend_patches() if name.startswith("hf_backend")}
    assert applied == names if not torch.cuda.is_available() else applied == names - {"hf_backend_sdpa_on_cpu"}


def test_llama4_refuses_what_the_backend_does_not_shard(tmp_path):
    from primus.backends.torchtitan.config import build_trainer_config
    from primus.backends.torchtitan.patches import apply_patches
    from primus.config.errors import ConfigError

    apply_patches()
    params = {"model": {"name": "llama4", "flavor": "17bx16e"}, "parallelism": {"expert_parallel_degree": 2}}
    with pytest.raises(ConfigError, match="expert_parallel_degree: 2: TorchTitan's expert parallelism"):
        build_trainer_config(params, run_dir=tmp_path, device="cpu")
    with pytest.raises(ConfigError, match="'17bx16' is not a Llama 4 flavor .*did you mean '17bx16e'"):
        build_trainer_config({"model": {"name": "llama4", "flavor": "17bx16"}}, run_dir=tmp_path, device="cpu")
