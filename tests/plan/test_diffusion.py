"""Wan 2.x planning: parameters exact against diffusers, forward FLOPs against torch's FLOP counter,
activation bytes against what autograd really saves, memory per the documented FSDP2 formula."""
from __future__ import annotations

import pytest

from primus.plan.diffusion import (GIB, KNOWN_TRANSFORMERS, ClipShape, DiffusionLayout, WanSpec,
                                   activation_bytes_per_block, check_wan_layout, estimate_wan_memory,
                                   make_wan_plan, training_flops_per_sample)

A14B = WanSpec.from_transformer_config(KNOWN_TRANSFORMERS["Wan-AI/Wan2.2-T2V-A14B-Diffusers"])
SMALL = dict(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=32, in_channels=16, out_channels=16,
             text_dim=48, freq_dim=32, ffn_dim=256, num_layers=3, cross_attn_norm=True,
             qk_norm="rms_norm_across_heads", rope_max_seq_len=64)


def test_latent_shape_and_tokens_of_a_480p_clip():
    clip = ClipShape(width=832, height=480, frames=81)
    assert clip.latent(A14B) == (16, 21, 60, 104)  # 4x time, 8x space, z_dim 16
    assert clip.tokens(A14B) == 21 * 30 * 52  # patch (1, 2, 2)


def test_parameters_per_expert_match_diffusers_exactly():
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    for config in (KNOWN_TRANSFORMERS["Wan-AI/Wan2.2-T2V-A14B-Diffusers"], SMALL):
        with torch.device("meta"):
            model = diffusers.WanTransformer3DModel(**config)
        assert WanSpec.from_transformer_config(config).total_params() == sum(p.numel() for p in model.parameters())
    assert A14B.total_params() == 14_288_491_584  # "A14B": two experts of 14.3B each


def test_forward_flops_match_torchs_flop_counter():
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    model = diffusers.WanTransformer3DModel(**SMALL)
    spec, clip = WanSpec.from_transformer_config(SMALL), ClipShape(width=64, height=48, frames=9, text_tokens=20)
    _, f, h, w = clip.latent(spec)
    # the math backend, so attention's matmuls are counted (the CPU flash kernel has no FLOP formula)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(torch.randn(1, 16, f, h, w), torch.tensor([500]), torch.randn(1, 20, 48), return_dict=False)
    assert training_flops_per_sample(spec, clip) == 3 * counter.get_total_flops()


def test_activation_bytes_per_block_match_what_autograd_saves():
    torch = pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    from diffusers.models.transformers.transformer_wan import WanTransformerBlock

    spec = WanSpec(num_layers=1, num_attention_heads=4, attention_head_dim=64, ffn_dim=512)
    clip = ClipShape(width=16 * 16, height=16 * 8, frames=5, text_tokens=64)  # S = 2 x 8 x 16 = 256 tokens
    s, d = clip.tokens(spec), spec.dim
    block = WanTransformerBlock(d, spec.ffn_dim, spec.num_attention_heads, "rms_norm_across_heads", True,
                                1e-6).to(torch.bfloat16)
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in params:
            saved.setdefault(key, t.untyped_storage().nbytes())
        return t

    x = torch.randn(1, s, d, dtype=torch.bfloat16, requires_grad=True)
    text = torch.randn(1, clip.text_tokens, d, dtype=torch.bfloat16)
    rotary = (torch.randn(1, s, 1, 64), torch.randn(1, s, 1, 64))  # shared by every block: not per block
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x, text, torch.randn(1, 6, d), rotary)
    measured = sum(saved.values()) - sum(r.untyped_storage().nbytes() for r in rotary)
    assert measured == pytest.approx(activation_bytes_per_block(spec, clip), rel=0.01)


def test_memory_per_rank_fsdp2_and_activation_checkpointing():
    clip = ClipShape(width=832, height=480, frames=81)
    full = estimate_wan_memory(A14B, DiffusionLayout(dp=8, clip=clip))
    p = A14B.total_params()
    assert full.weights == full.grads == -(-p * 4 // 8) and full.optimizer == -(-p * 8 // 8)  # fp32, Adam m+v
    assert full.weights + full.grads + full.optimizer == pytest.approx(16 * p / 8, abs=8)
    ac = estimate_wan_memory(A14B, DiffusionLayout(dp=8, clip=clip, activation_checkpointing=True))
    s, d = clip.tokens(A14B), A14B.dim
    assert ac.activations == 40 * 2 * s * d + activation_bytes_per_block(A14B, clip) + 12 * s * d
    assert ac.activations < full.activations / 15
    on_mi300x = make_wan_plan(A14B, DiffusionLayout(dp=8, clip=clip, activation_checkpointing=True), "mi300x")
    assert on_mi300x.fits and on_mi300x.memory.total / GIB == pytest.approx(54.6, abs=0.5)
    assert make_wan_plan(A14B, DiffusionLayout(dp=8, clip=clip), "mi355x").fits is False


def test_bad_wan_layouts_are_named():
    issues = check_wan_layout(A14B, DiffusionLayout(dp=4, global_batch_size=6, clip=ClipShape(830, 480, 80)), 8)
    messages = [i.message for i in issues]
    assert any("does not equal the world size 8" in m for m in messages)
    assert any("global_batch_size (6)" in m for m in messages)
    assert any("4k+1 frames" in m for m in messages) and any("830x480" in m for m in messages)


def test_a_snapshot_folder_named_after_a_published_model_plans_as_that_model():
    """AMD Primus's Wan preset names its cluster's snapshot (/models/Wan2.2-T2V-A14B-Diffusers), absent here."""
    from primus.plan.diffusion import known_name, known_transformer

    hub = "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
    assert known_name("/models/Wan2.2-T2V-A14B-Diffusers/") == known_name(hub) == hub
    assert known_transformer("/models/Wan2.2-T2V-A14B-Diffusers") == KNOWN_TRANSFORMERS[hub]
    assert known_name("Wan2.2-T2V-A14B-Diffusers") is None  # a bare name is a Hub id, and not this one
    assert known_name("/models/Wan2.1-T2V-1.3B-Diffusers") is None
