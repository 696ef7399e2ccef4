"""Model FLOPs, one convention for every backend, so TFLOP/s and MFU compare across engines.

Dense decoder FLOPs per token (training = forward + backward = 3 x forward):

    flops_per_token = 6 * N_matmul + 6 * n_layers * seq_len * dim      (causal)

``N_matmul`` counts the parameters that take part in matrix multiplies (all except
embeddings and norms; the output head counts). The attention term is the score and
value matmuls, 2 * 2 * seq * dim per token forward, halved because a causal mask makes
half of the scores zero: 12 * L * s * d / 2 = 6 * L * s * d. (PaLM's appendix B uses 12 *
L * s * d, i.e. no causal discount; we state ours and use it for every backend.)
"""
from __future__ import annotations


def dense_decoder_flops_per_token(
    *, n_layers: int, dim: int, seq_len: int, matmul_params: int, causal: bool = True
) -> float:
    """Training FLOPs per token of a dense decoder (see module docstring for the formula)."""
    attention = 12 * n_layers * seq_len * dim
    return 6 * matmul_params + (attention / 2 if causal else attention)


def training_flops_per_token(model, seq_len: int) -> float:
    """Training FLOPs per token of ``model`` (a ``primus.plan.model.ModelSpec``) at ``seq_len``:
    the number every backend reports TFLOP/s and MFU with, and ``primus plan`` prints."""
    return dense_decoder_flops_per_token(n_layers=model.n_layers, dim=model.dim, seq_len=seq_len,
                                         matmul_params=model.matmul_params())
