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


def _backend_model(tmp_path, config, float8=None):
    """The model exactly as TorchTitan's trainer makes it: the spec Primus builds, update_from_config from
    hf_model, built on meta, (``float8``: swapped to float8, as its ``parallelize_fn`` starts,) materialised,
    ``init_states``."""
    from primus.backends.torchtitan.patches import apply_hf_backend_patches

    apply_hf_backend_patches()  # before any torchtitan import (CPU device, triton stub)
    from primus.backends.torchtitan.hooks import PrimusHFTrainer

    spec = llama4.titan_spec("debugmodel", config)
    trainer_config = PrimusHFTrainer.Config(model_spec=spec, hf_model=str(tmp_path / "hf"))
    trainer_config.training.seq_len = SEQ
    spec.model.update_from_config(config=trainer_config)
    with torch.device("meta"):
        model = spec.model.build()
    if float8 is not None:
        from primus.backends.torchtitan.float8 import swap_hf_linears

        swap_hf_linears(model, float8, compile_enabled=False)
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


@pytest.mark.e2e  # the backend's attention compiles (a subprocess)
def test_float8_swaps_the_backend_models_linears_but_not_router_or_experts(tmp_path):
    """torchao's Float8Linear in place of every plain nn.Linear with dims multiple of 16 (attention, dense and
    shared-expert MLPs, lm_head), minus filter_fqns; Llama4Router and the 3-D experts stay; it trains, and
    its logits follow the same weights' in fp32."""
    from torchao.float8.float8_linear import Float8Linear
    from transformers.models.llama4.modeling_llama4 import Llama4Router, Llama4TextExperts

    from primus.backends.torchtitan.float8 import Float8Settings, hf_linears_to_swap
    from primus.backends.torchtitan.patches import apply_patches

    assert "llama4_moe_float8_add" in apply_patches(("llama4", "float8"))  # as a float8 Llama 4 run's

    config = _tiny_config(tmp_path)
    settings = Float8Settings(recipe_name="tensorwise", emulate=True, filter_fqns=["layers.0.self_attn.q_proj"])
    model = _backend_model(tmp_path, config, float8=settings)
    reference = _backend_model(tmp_path, config)
    swapped = {name for name, module in model.named_modules() if isinstance(module, Float8Linear)}
    linears = {name for name, module in reference.named_modules() if type(module) is torch.nn.Linear}
    assert swapped == linears - {"model.model.layers.0.self_attn.q_proj"} and "model.lm_head" in swapped
    assert len(swapped) == hf_linears_to_swap(llama4.config_json(config), settings, compile_enabled=False) == 28
    assert all(type(m) is Llama4Router for m in model.modules() if isinstance(m, Llama4Router))
    assert any(isinstance(m, Llama4TextExperts) for m in model.modules())
    assert all(layer.config.emulate for layer in model.modules() if isinstance(layer, Float8Linear))
    model.load_state_dict(reference.state_dict())  # same names: checkpoints are unchanged
    tokens = torch.randint(0, 256, (2, SEQ), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(SEQ).expand(2, SEQ)
    ours, theirs = model(tokens, positions=positions), reference(tokens, positions=positions)
    assert (ours - theirs).abs().max().item() < 0.1 * theirs.abs().max().item()
    ours.float().logsumexp(-1).mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("flavor,total,active", [("17bx16e", 109e9, 17e9), ("17bx128e", 400e9, 17e9)])
def test_flavors_match_the_published_sizes(flavor, total, active):
    """Scout 109B total / 17B active, Maverick 400B / 17B (Meta's model cards), within 2%."""
    counts = llama4.neutral_spec(llama4.text_config(flavor), flavor).param_counts()
    assert abs(counts.total / total - 1) < 0.02, counts
    assert abs(counts.active / active - 1) < 0.02, counts


STEPS = 12


@pytest.fixture(scope="module")
def llama4_runs(tmp_path_factory, tiny_cache):
    """``llama4_runs(name)`` -> (run dir, losses) of the real TorchTitan trainer on the transformers backend, one
    rank (gloo), the learnable tiny corpus, ``STEPS`` steps: TorchTitan's llama4 debugmodel cut to 4 layers
    (dense/MoE interleaved, layer 3 NoPE), chunk 32 < seq 64; "fp32", or "float8" (torchao's tensorwise
    emulation in the transformers model's Linear layers) on the same data and seed. Each trains once for
    the module."""
    from primus.data.tiny_assets import ensure_tiny_assets
    from tests.helpers import read_metrics, train_with_torchrun

    ensure_tiny_assets(tiny_cache / "tiny_llm")
    root, trained = tmp_path_factory.mktemp("llama4"), {}
    converters = {"fp32": None, "float8": {"float8": {"recipe_name": "tensorwise", "emulate": True}}}

    def run(name: str) -> tuple:
        if name not in trained:
            params = {"model": {"name": "llama4", "flavor": "debugmodel", "n_layers": 4, "vocab_size": 512,
                                "converters": converters[name]},
                      "primus": {"tiny_assets": str(tiny_cache / "tiny_llm")}, "optimizer": {"lr": 2e-3},
                      "lr_scheduler": {"warmup_steps": 2}, "debug": {"seed": 42},
                      "training": {"steps": STEPS, "local_batch_size": 4, "seq_len": 64}}
            result = train_with_torchrun(root / name, "torchtitan", params, nproc=1, timeout=900)
            assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
            trained[name] = (root / name, [row["loss"] for row in read_metrics(root / name)])
        return trained[name]

    return run


@pytest.mark.e2e
def test_tiny_llama4_trains_on_cpu(llama4_runs):
    run_dir, losses = llama4_runs("fp32")
    print("losses", [round(loss, 3) for loss in losses])
    assert len(losses) == STEPS and all(map(math.isfinite, losses))
    assert losses[-1] < 0.6 * losses[0], losses
    written = llama4.read_config(run_dir / llama4.CONFIG_DIR / "config.json")
    assert written["model_type"] == "llama4_text" and written["num_hidden_layers"] == 4


@pytest.mark.e2e
def test_tiny_llama4_in_float8_follows_the_fp32_run(llama4_runs):
    """The float8 run against the fp32 run of ``test_tiny_llama4_trains_on_cpu``."""
    (_, fp32), (float8_dir, float8) = llama4_runs("fp32"), llama4_runs("float8")
    print("fp32", [round(loss, 3) for loss in fp32], "float8", [round(loss, 3) for loss in float8])
    logs = float8_dir / "logs" / "pre_trainer" / "rank-0"
    info = (logs / "info.log").read_text()
    assert "derived model.converters.float8=tensorwise, 29 Linear layers" in info  # the plan's count
    assert "float8 (tensorwise, emulated): 29 Linear layers of the transformers model are torchao Float8Linear" in info
    assert "torchtitan patch applied: llama4_moe_float8_add: " in (logs / "debug.log").read_text()
    assert len(fp32) == len(float8) == STEPS
    assert float8[-1] < 0.6 * float8[0]  # it learns
    assert float8[-1] == pytest.approx(fp32[-1], rel=0.05), (fp32[-1], float8[-1])
    assert float8 != fp32  # float8 casts ran: not the fp32 numbers


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
