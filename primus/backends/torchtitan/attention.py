"""Per-document causal attention through SDPA: packed sequences on a host without FlexAttention.

TorchTitan keeps packed documents apart only in its FlexAttention and varlen kernels; torch 2.13
has no FlexAttention backward on CPU ("FlexAttention does not support backward on CPU") and its
varlen kernel is CUDA-only, while TorchTitan's ``ScaledDotProductAttention`` takes no mask at all.
``DocumentCausalSDPA`` is a ``VarlenAttention`` to TorchTitan, so the trainer and the validator
build its masks with TorchTitan's own ``Decoder.get_attention_masks`` (document starts where
``positions`` restarts at 0, ``create_varlen_metadata_for_document``); its kernel is SDPA with that
boundary turned into an explicit block-diagonal causal mask. Nothing of TorchTitan is replaced.

The mask is dense (``B x L x L`` booleans per step), which is what a CPU run can afford anyway.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torchtitan.models.common.attention import VarlenAttention, VarlenMetadata


def document_causal_mask(metadata: VarlenMetadata, batch: int, seq_len: int) -> torch.Tensor:
    """``(batch, 1, seq_len, seq_len)`` booleans: a query sees the keys of its own document, up to itself.

    ``metadata.cu_seq_q`` holds the document starts over the flattened ``batch * seq_len`` tokens
    (then the total); every row's first token starts a document too, whatever its position."""
    device = metadata.cu_seq_q.device
    starts = torch.zeros(batch * seq_len, dtype=torch.int64, device=device)
    starts[metadata.cu_seq_q[:-1].long()] = 1
    starts[torch.arange(batch, device=device) * seq_len] = 1
    document = starts.cumsum(0).view(batch, seq_len)
    same = document[:, :, None] == document[:, None, :]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
    return (same & causal).unsqueeze(1)


class DocumentCausalSDPA(VarlenAttention):
    """SDPA over per-document causal masks, from the document boundaries TorchTitan derives for varlen."""

    @dataclass(kw_only=True, slots=True)
    class Config(VarlenAttention.Config):
        pass

    def forward(self, q_BLNH: torch.Tensor, k_BLNH: torch.Tensor, v_BLNH: torch.Tensor, *,
                attention_masks: VarlenMetadata, scale: float | None = None, enable_gqa: bool = False,
                **kwargs) -> torch.Tensor:
        if not isinstance(attention_masks, VarlenMetadata):
            raise TypeError(f"DocumentCausalSDPA needs the document boundaries (VarlenMetadata, built from the "
                            f"batch's positions), got {type(attention_masks).__name__}")
        if kwargs.get("out_transform") is not None:
            raise NotImplementedError("DocumentCausalSDPA returns no softmax normaliser (attention sinks need flex)")
        batch, seq_len = q_BLNH.shape[:2]
        mask = document_causal_mask(attention_masks, batch, seq_len)
        out = F.scaled_dot_product_attention(q_BLNH.transpose(1, 2), k_BLNH.transpose(1, 2), v_BLNH.transpose(1, 2),
                                             attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
        return out.transpose(1, 2)


def use_document_sdpa(model_config) -> int:
    """Every causal-SDPA attention of a TorchTitan model config made per-document; how many were."""
    from torchtitan.models.common.attention import ScaledDotProductAttention

    swapped = 0
    for _, _, parent, attr in list(model_config.traverse(ScaledDotProductAttention.Config)):
        setattr(parent, attr, DocumentCausalSDPA.Config())
        swapped += 1
    return swapped
