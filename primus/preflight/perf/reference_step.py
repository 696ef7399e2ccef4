"""The local profile's compute efficiency: one measured eager training step against its own projection.

A CPU runs a transformer eagerly: every norm, rotary embedding, activation and residual is its own
kernel with its own dispatch, temporaries and autograd bookkeeping, and a step's GEMMs run slower than
a probe's back-to-back ones. Rather than model each of those, preflight runs a small reference model
(a Llama-style decoder written in plain torch: RMSNorm, rotary q/k, grouped-query SDPA, SwiGLU, a
cross-entropy head) forward and backward on this host and projects the same model with the profile's
other probes. The ratio, projected over measured, is the ``compute`` efficiency every projection on
this profile divides its layers' and head's compute by (one number per thread count, measured, nothing
fitted to the layouts it then projects; AMD Primus's own ``projection`` benchmarks a real layer on the
device for the same reason). Its shape is not the 25M benchmark preset's.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

# the reference: 2 layers, hidden 384, 6 heads over 3 KV groups, SwiGLU 1024, 1,000 tokens of vocabulary,
# a micro-batch of 2 x 256 tokens, fp32
REFERENCE = dict(n_layers=2, dim=384, n_heads=6, n_kv_heads=3, ffn_hidden_size=1024, vocab_size=1000)
BATCH, SEQ = 2, 256


def _reference_model(torch: Any):
    nn, F = torch.nn, torch.nn.functional
    dim, heads, kv_heads, ffn = (REFERENCE[k] for k in ("dim", "n_heads", "n_kv_heads", "ffn_hidden_size"))
    head_dim = dim // heads

    def rotate(x, cos, sin):  # rotary embedding as the engines' eager path computes it
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.ffn_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
            self.wq, self.wk = nn.Linear(dim, dim, bias=False), nn.Linear(dim, kv_heads * head_dim, bias=False)
            self.wv, self.wo = nn.Linear(dim, kv_heads * head_dim, bias=False), nn.Linear(dim, dim, bias=False)
            self.w1, self.w3 = nn.Linear(dim, ffn, bias=False), nn.Linear(dim, ffn, bias=False)
            self.w2 = nn.Linear(ffn, dim, bias=False)

        def forward(self, x, cos, sin):
            b, s, _ = x.shape
            h = self.attention_norm(x)
            q = rotate(self.wq(h).view(b, s, heads, head_dim).transpose(1, 2), cos, sin)
            k = rotate(self.wk(h).view(b, s, kv_heads, head_dim).transpose(1, 2), cos, sin)
            v = self.wv(h).view(b, s, kv_heads, head_dim).transpose(1, 2)
            attention = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + self.wo(attention.transpose(1, 2).reshape(b, s, dim))
            h = self.ffn_norm(x)
            return x + self.w2(F.silu(self.w1(h)) * self.w3(h))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(REFERENCE["vocab_size"], dim)
            self.layers = nn.ModuleList(Layer() for _ in range(REFERENCE["n_layers"]))
            self.norm, self.output = nn.RMSNorm(dim), nn.Linear(dim, REFERENCE["vocab_size"], bias=False)
            angles = torch.outer(torch.arange(SEQ, dtype=torch.float32),
                                 1.0 / 10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
            self.register_buffer("cos", torch.cat((angles, angles), dim=-1).cos(), persistent=False)
            self.register_buffer("sin", torch.cat((angles, angles), dim=-1).sin(), persistent=False)

        def forward(self, tokens, labels):
            x = self.embedding(tokens)
            for layer in self.layers:
                x = layer(x, self.cos, self.sin)
            logits = self.output(self.norm(x)).float()
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten())

    return Decoder()


def measured_step_seconds(threads: int, budget_s: float = 1.0) -> float:
    """Best-of seconds of the reference's forward + backward with ``threads`` intra-op threads."""
    import torch

    from primus.plan.devices import best_seconds, intra_op_threads

    with intra_op_threads(threads):
        torch.manual_seed(0)
        model = _reference_model(torch)
        tokens = torch.randint(0, REFERENCE["vocab_size"], (BATCH, SEQ))
        labels = torch.randint(0, REFERENCE["vocab_size"], (BATCH, SEQ))

        def step() -> None:
            model(tokens, labels).backward()
            for p in model.parameters():
                p.grad = None

        return best_seconds(step, budget_s)


def projected_compute_seconds(profile: Any, threads: int) -> float:
    """The projection's compute for the reference on ``profile`` as one rank with ``threads`` threads."""
    from primus.plan.layout import ParallelLayout
    from primus.plan.model import ModelSpec
    from primus.plan.projection import ProjectionOptions, project

    as_measured = replace(profile, efficiency=replace(profile.efficiency, compute=1.0))
    one_rank = as_measured.for_ranks_per_node(1, threads=threads)
    layout = ParallelLayout(micro_batch_size=BATCH, global_batch_size=BATCH, seq_len=SEQ, param_dtype="fp32",
                            grad_dtype="fp32")
    options = ProjectionOptions(gemm_dtype="fp32", fused_elementwise=False, attention="sdpa", recompute="none")
    return project(ModelSpec(**REFERENCE), layout, one_rank, options).breakdown["compute"]


def compute_efficiency_by_threads(profile: Any, budget_s: float = 1.0) -> dict[int, float]:
    """Projected over measured compute of the reference step, at each thread count the profile has a GEMM
    rate for (a CPU rank runs with cores / ranks threads)."""
    return {threads: projected_compute_seconds(profile, threads) / measured_step_seconds(threads, budget_s)
            for threads in sorted(profile.gemm_tflops_by_threads)}
