"""Models of TorchTitan's own registry (``model: {name, flavor}``): checked keys, overrides, and the
neutral ``ModelSpec`` that ``primus plan`` reads, which must count what TorchTitan builds."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")

from primus.config.errors import ConfigError  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _engine():
    from primus.backends.torchtitan.patches import apply_patches

    apply_patches()


def _fail(key: str, message: str) -> ConfigError:
    return ConfigError(f"{key}: {message}")


def build(**block):
    from primus.backends.torchtitan.registry import RegistryModel, build as build_model

    return build_model(RegistryModel(**block), "sdpa", _fail)


def parse(**block):
    from primus.backends.torchtitan.registry import parse as parse_block

    return parse_block(block, lambda schema, data: schema.model_validate(data), _fail)


def engine_count(spec) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in spec.model.build().parameters())


# Dense GQA, qk-norm, tied embeddings, MoE with and without shared experts, MLA, and their debug shapes.
FLAVOURS = [("llama3", "8B"), ("llama3", "405B"), ("qwen3", "0.6B"), ("qwen3", "32B"), ("qwen3", "debugmodel_moe"),
            ("qwen3", "30B-A3B"), ("qwen3", "235B-A22B"), ("deepseek_v3", "debugmodel"), ("deepseek_v3", "16B"),
            ("deepseek_v3", "671B")]


@pytest.mark.parametrize("name, flavor", FLAVOURS)
def test_the_neutral_spec_counts_exactly_what_torchtitan_builds(name, flavor):
    from primus.backends.torchtitan.plan import model_spec_from_titan

    spec = build(name=name, flavor=flavor)
    neutral = model_spec_from_titan(spec.model, f"{name} {flavor}")
    assert neutral.total_params() == engine_count(spec)
    assert neutral.is_moe == ("moe" in flavor or "-A" in flavor or name == "deepseek_v3")


def test_gpt_oss_is_counted_but_for_its_attention_sinks_and_router_biases():
    """ModelSpec has no field for gpt-oss's per-head attention sinks or its router biases. On CPU it keeps
    FlexAttention (the sinks need the softmax normaliser): it plans anywhere and trains on GPU."""
    from torchtitan.models.common.attention import FlexAttention

    from primus.backends.torchtitan.plan import model_spec_from_titan

    spec = build(name="gpt_oss", flavor="20b")
    assert all(isinstance(layer.attention.inner_attention, FlexAttention.Config) for layer in spec.model.layers)
    layers, heads, experts = 24, 64, 32
    neutral = model_spec_from_titan(spec.model, "gpt_oss 20b")
    assert engine_count(spec) - neutral.total_params() == layers * (heads + experts)


def test_overrides_reshape_every_part_consistently():
    from primus.backends.torchtitan.plan import model_spec_from_titan

    spec = build(name="deepseek_v3", flavor="debugmodel", n_layers=2, vocab_size=512, num_experts=4, top_k=2)
    neutral = model_spec_from_titan(spec.model, "tiny")
    assert (neutral.n_layers, neutral.vocab_size, neutral.n_experts, neutral.top_k) == (2, 512, 4, 2)
    assert neutral.moe_layer_freq == [0, 1]  # the flavor's first layer is dense
    assert neutral.total_params() == engine_count(spec)  # router, experts and dispatcher agree
    from torchtitan.models.common.attention import ScaledDotProductAttention

    assert all(isinstance(layer.attention.inner_attention, ScaledDotProductAttention.Config)
               for layer in spec.model.layers)


def test_registry_keywords_pass_through():
    spec = build(name="deepseek_v3", flavor="debugmodel", num_mtp_layers=1)
    assert len(spec.model.mtp_layers) == 1


@pytest.mark.parametrize("block, message", [
    ({"name": "deepsek_v3", "flavor": "16B"}, "model.name: 'deepsek_v3' is not a TorchTitan model (did you mean 'deepseek_v3'?)"),
    ({"name": "qwen3", "flavor": "30b-a3b"}, "model.flavor: '30b-a3b' is not a flavor of TorchTitan's qwen3 (did you mean '30B-A3B'?)"),
    ({"name": "qwen3", "flavor": "8B", "n_layer": 2}, "model.n_layer: unknown key for TorchTitan's qwen3 model (did you mean 'n_layers'?)"),
    ({"name": "qwen3"}, "model.flavor: missing"),
    ({"name": "flux", "flavor": "flux-debug"}, "model.name: 'flux' is not a TorchTitan model"),
])
def test_a_wrong_registry_block_is_one_error_naming_the_key(block, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        parse(**block)


@pytest.mark.parametrize("block, message", [
    ({"name": "qwen3", "flavor": "8B", "n_layers": 99}, "model.n_layers: 99 is more than the 36 layers"),
    ({"name": "qwen3", "flavor": "8B", "num_experts": 8}, "model.num_experts: qwen3 8B has no MoE layers"),
    ({"name": "qwen3", "flavor": "debugmodel_moe", "top_k": 65}, "model.top_k: top_k 65 is more than the 64 experts"),
])
def test_overrides_the_flavor_cannot_take_are_refused(block, message):
    with pytest.raises(ConfigError, match=message):
        build(**block)
