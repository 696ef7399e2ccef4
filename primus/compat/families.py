"""What AMD Primus runs and this Primus does not: one clear line instead of "unknown preset/framework".

AMD Primus (fd1eeab) ships trainers and model families outside the three PyTorch engines Primus
wraps (TorchTitan, megatron-core GPT models, NeMo AutoModel diffusion). An experiment naming one
of them is refused with the reason, not with a did-you-mean to an unrelated name.
"""
from __future__ import annotations

import re

FRAMEWORKS = {
    "maxtext": "MaxText is a JAX trainer; Primus runs PyTorch engines (torchtitan, megatron, nemo_automodel)",
    "maxdiffusion": "MaxDiffusion is a JAX trainer; Primus runs PyTorch engines (torchtitan, megatron, "
                    "nemo_automodel)",
    "megatron_bridge": "Megatron-Bridge needs Transformer Engine; Primus runs megatron-core directly "
                       "(framework: megatron)",
    "diffusion": "AMD Primus's own diffusion trainer is not a Primus backend (Wan 2.2: framework: nemo_automodel)",
    "hummingbirdxt": "HummingbirdXT is not a Primus backend",
}

# (framework, model preset name pattern, reason)
MODEL_FAMILIES = [
    ("megatron", re.compile(r"zebra_llama|mamba|hybrid"),
     "Mamba / hybrid models (Zebra-Llama, Mamba) are not megatron-core GPT models, which Primus's Megatron "
     "backend builds"),
    ("megatron", re.compile(r"(^|/)diffusion/|flux"),
     "Flux / diffusion models are not trained by Primus's Megatron backend (GPT models); Wan 2.2 runs on "
     "framework: nemo_automodel"),
    ("megatron", re.compile(r"deepseek_v4"), "DeepSeek-V4 (hyper-connections, compressed sparse attention) is not "
                                             "in megatron-core 0.16"),
    ("megatron", re.compile(r"kimi_k3"), "Kimi-K3 (KDA linear attention) is not in megatron-core 0.16"),
    ("megatron", re.compile(r"lfm"), "LFM2 (short convolutions) is not in megatron-core 0.16"),
    ("megatron", re.compile(r"qwen3_5|qwen3\.5"),
     "Qwen3.5 (Gated DeltaNet linear attention, megatron-core's experimental_attention_variant) is not built by "
     "Primus's Megatron backend"),
    ("megatron", re.compile(r"glm_?5"),
     "GLM-5 (DeepSeek Sparse Attention: an indexer on MLA, megatron-core's experimental_attention_variant) is not "
     "built by Primus's Megatron backend"),
    ("megatron", re.compile(r"minimax"),
     "MiniMax-M2.5 normalises q and k over all heads (qk_norm_type per_layer), which megatron-core 0.16's per-head "
     "qk_layernorm does not build"),
]


def framework_reason(framework: str) -> str | None:
    return FRAMEWORKS.get(framework)


def model_reason(framework: str, preset: str) -> str | None:
    for family_framework, pattern, reason in MODEL_FAMILIES:
        if framework == family_framework and pattern.search(preset):
            return reason
    return None
