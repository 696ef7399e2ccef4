"""config.json <-> ModelSpec, the HF shape check, and the megatron-core layout rules."""
from __future__ import annotations

import pytest

from primus.config.errors import ConfigError

pytest.importorskip("transformers")


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mixtral"])
def test_spec_from_config_matches_every_tensor_of_a_real_checkpoint(family, hf_models):
    from primus.hf.checkpoint import HFCheckpoint, check_against_spec, expected_shapes
    from primus.hf.config import model_spec_from_hf

    checkpoint = HFCheckpoint(hf_models(family))
    spec = model_spec_from_hf(checkpoint.config)
    check_against_spec(checkpoint, spec, "test")
    assert set(expected_shapes(spec)) == set(checkpoint.names())
    assert (spec.qkv_bias, spec.qk_norm, spec.is_moe) == (family == "qwen2", family == "qwen3", family == "mixtral")
    if family == "qwen3":
        assert spec.head_dim == 48 != spec.dim // spec.n_heads


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mixtral"])
def test_config_written_from_a_spec_reads_back_as_the_same_spec(family, hf_models):
    from primus.hf.config import hf_config_from_spec, model_spec_from_hf, read_config

    spec = model_spec_from_hf(read_config(hf_models(family)))
    assert model_spec_from_hf(hf_config_from_spec(spec)) == spec


def test_llama31_rope_scaling_is_read_and_other_scalings_refused():
    from primus.hf.config import LLAMA31_ROPE, model_spec_from_hf

    base = dict(model_type="llama", hidden_size=64, num_attention_heads=4, num_hidden_layers=1, intermediate_size=96,
                vocab_size=128)
    spec = model_spec_from_hf({**base, "rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", **LLAMA31_ROPE}})
    assert spec.rope_scaling == "llama" and spec.rope_theta == 5e5
    with pytest.raises(ConfigError, match="RoPE scaling 'yarn'"):
        model_spec_from_hf({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ConfigError, match="model_type 'gpt2' is not supported"):
        model_spec_from_hf({**base, "model_type": "gpt2"})
    with pytest.raises(ConfigError, match="hidden_act 'gelu'"):
        model_spec_from_hf({**base, "hidden_act": "gelu"})


def test_shape_mismatch_names_the_tensor_and_both_shapes(hf_models):
    from primus.hf.checkpoint import HFCheckpoint, check_against_spec
    from primus.hf.config import model_spec_from_hf

    checkpoint = HFCheckpoint(hf_models("llama"))
    spec = model_spec_from_hf(checkpoint.config).model_copy(update={"ffn_hidden_size": 256})
    with pytest.raises(ConfigError) as error:
        check_against_spec(checkpoint, spec, "modules.pre_trainer.hf_path")
    message = str(error.value)
    assert "\n" not in message
    assert "tensor model.layers.0.mlp.gate_proj.weight has shape (352, 128)" in message and "expects (256, 128)" in message


def test_megatron_qkv_layout_groups_heads_and_inverts_exactly():
    torch = pytest.importorskip("torch")
    from primus.backends.megatron.hf_adapter import _qkv, _split_qkv
    from primus.plan.model import ModelSpec

    spec = ModelSpec(n_layers=1, dim=8, n_heads=4, n_kv_heads=2, vocab_size=16, head_dim=2)
    q = torch.arange(8).repeat_interleave(8).view(8, 8) * 1.0  # row r of q belongs to head r // 2
    k = 100 + torch.arange(4).repeat_interleave(8).view(4, 8) * 1.0
    v = 200 + torch.arange(4).repeat_interleave(8).view(4, 8) * 1.0
    fused = _qkv(q, k, v, spec)
    # group 0: q heads 0,1 (rows 0-3), k head 0, v head 0; then group 1
    assert fused[:, 0].tolist() == [0, 1, 2, 3, 100, 101, 200, 201, 4, 5, 6, 7, 102, 103, 202, 203]
    assert all(torch.equal(a, b) for a, b in zip(_split_qkv(fused, spec), (q, k, v)))


@pytest.mark.parametrize("family, shape", [("llama", {}), ("llama", {"tie_word_embeddings": True}), ("qwen2", {}),
                                           ("qwen3", {}), ("mixtral", {})])
def test_megatron_rules_invert_exactly(family, shape, hf_models):
    """HF -> megatron-core global tensors (layers and experts stacked, as torch_dist stores them) -> HF."""
    torch = pytest.importorskip("torch")
    from primus.hf.checkpoint import HFCheckpoint, check_against_spec
    from primus.hf.config import model_spec_from_hf
    from primus.backends.megatron.hf_adapter import LAYER, MegatronHFMapping, megatron_to_hf

    checkpoint = HFCheckpoint(hf_models(family, **shape))
    spec = model_spec_from_hf(checkpoint.config)
    check_against_spec(checkpoint, spec, "test")
    assert spec.tie_embeddings == ("lm_head.weight" not in checkpoint)
    mapping = MegatronHFMapping(spec)
    full = {}
    for key in ("embedding.word_embeddings.weight", "output_layer.weight", "decoder.final_layernorm.weight"):
        names, combine = mapping.sources(key, ())
        full[key] = combine(*(checkpoint.tensor(n) for n in names))
    for local in mapping.layer_rules:
        if local == "pre_mlp_layernorm.weight":
            continue  # the same HF tensor as mlp.linear_fc1.layer_norm_weight (local spec name)
        layers = [mapping.sources(LAYER + local, (i,)) for i in range(spec.n_layers)]
        full[LAYER + local] = torch.stack([c(*(checkpoint.tensor(n) for n in names)) for names, c in layers])
    for local in mapping.expert_rules:
        key = f"{LAYER}mlp.experts.experts.{local}"
        full[key] = torch.stack([torch.stack([
            (lambda names, c: c(*(checkpoint.tensor(n) for n in names)))(*mapping.sources(key, (i, e)))
            for e in range(spec.n_experts)]) for i in range(spec.n_layers)])
    back = megatron_to_hf(full, spec)
    assert sorted(back) == sorted(checkpoint.names())
    assert all(back[name].equal(checkpoint.tensor(name)) for name in back)
