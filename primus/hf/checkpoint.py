"""Hugging Face checkpoint folders on disk: read tensors lazily, check them against a model, write them.

Reading uses the safetensors headers only until a tensor is asked for, so the launcher can check
every name and shape of a multi-GB checkpoint before any rank starts, and each rank later reads
only the tensors its shard needs.
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from primus.config.errors import ConfigError
from primus.hf.config import read_config
from primus.plan.model import ModelSpec

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "tokenizer.model", "vocab.json", "merges.txt", "generation_config.json")


class HFCheckpoint:
    """A model folder: ``config.json`` + ``*.safetensors`` (+ ``model.safetensors.index.json``)."""

    def __init__(self, model_dir: str | Path):
        self.dir = Path(model_dir).expanduser().absolute()
        self.config = read_config(self.dir)
        files = sorted(self.dir.glob("*.safetensors"))
        if not files:
            raise ConfigError(f"{self.dir}: no *.safetensors weights (only safetensors checkpoints are read)")
        from safetensors import safe_open

        self._where: dict[str, Path] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._dtypes: dict[str, str] = {}
        for file in files:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():
                    piece = handle.get_slice(name)
                    self._where[name], self._shapes[name] = file, tuple(piece.get_shape())
                    self._dtypes[name] = piece.get_dtype()
        self._handles: dict[Path, Any] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def names(self) -> list[str]:
        return list(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def dtype(self) -> str:
        """The most common storage dtype (safetensors spelling: F32, BF16, F16)."""
        counts: dict[str, int] = {}
        for dtype in self._dtypes.values():
            counts[dtype] = counts.get(dtype, 0) + 1
        return max(counts, key=counts.get)

    def tensor(self, name: str):
        if name not in self._where:
            raise ConfigError(f"{self.dir}: tensor {name} is not in the checkpoint")
        from safetensors import safe_open

        file = self._where[name]
        if file not in self._handles:
            self._handles[file] = safe_open(str(file), framework="pt")
        return self._handles[file].get_tensor(name)

    def tensors(self) -> Iterator[tuple[str, Any]]:
        for name in self._where:
            yield name, self.tensor(name)


def expected_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every tensor a HF checkpoint of ``spec`` holds, with its shape (HF names)."""
    d, hd = spec.dim, spec.head_dim
    q, kv = spec.n_heads * hd, spec.kv_heads * hd
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (spec.vocab_size, d), "model.norm.weight": (d,)}
    if not spec.tie_embeddings:
        shapes["lm_head.weight"] = (spec.vocab_size, d)
    for i in range(spec.n_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (q, d), p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, q),
        })
        if spec.qkv_bias:
            shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)})
        if spec.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})
        if spec.is_moe:
            f = spec.moe_ffn_hidden_size
            shapes[p + "block_sparse_moe.gate.weight"] = (spec.n_experts, d)
            for e in range(spec.n_experts):
                x = f"{p}block_sparse_moe.experts.{e}."
                shapes.update({x + "w1.weight": (f, d), x + "w3.weight": (f, d), x + "w2.weight": (d, f)})
        else:
            f = spec.ffn_dim
            shapes.update({p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                           p + "mlp.down_proj.weight": (d, f)})
    return shapes


def check_against_spec(checkpoint: HFCheckpoint, spec: ModelSpec, where: str) -> None:
    """Every tensor the model needs is there with its shape: else ONE line naming the tensor."""
    expected = expected_shapes(spec)
    ignorable = ("rotary_emb.inv_freq",)
    for name, shape in expected.items():
        if name not in checkpoint:
            if name == "lm_head.weight" and spec.tie_embeddings:
                continue
            raise ConfigError(f"{where}: tensor {name} (shape {shape}) is missing from {checkpoint.dir}")
        if checkpoint.shape(name) != shape:
            raise ConfigError(f"{where}: tensor {name} has shape {checkpoint.shape(name)} in {checkpoint.dir}, "
                              f"the model expects {shape}")
    extra = [n for n in checkpoint.names() if n not in expected and not n.endswith(ignorable)
             and not (n == "lm_head.weight" and spec.tie_embeddings)]
    if extra:
        raise ConfigError(f"{where}: tensor {extra[0]} (shape {checkpoint.shape(extra[0])}) in {checkpoint.dir} "
                          f"has no place in the model ({len(extra)} such tensors)")


def _save(save_file, tensors: dict[str, Any], path: Path) -> None:
    """safetensors' ``save_file``; its I/O failures (a full disk) raised as the ``OSError`` they are."""
    import re

    from safetensors import SafetensorError

    try:
        save_file(tensors, str(path), metadata={"format": "pt"})
    except SafetensorError as exc:
        code = re.search(r"\(os error (\d+)\)", str(exc))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(path)) from None


def save_hf_checkpoint(out_dir: str | Path, tensors: dict[str, Any], config: dict[str, Any], *,
                       tokenizer_from: str | Path | None = None, max_shard_bytes: int = 5 * 2**30) -> Path:
    """Write ``config.json``, ``model.safetensors`` (or shards + index) and the tokenizer files."""
    from safetensors.torch import save_file

    out = Path(out_dir).expanduser().absolute()
    out.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, Any]] = [{}]
    size = 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name], size = tensor, size + nbytes
    if len(shards) == 1:
        _save(save_file, shards[0], out / "model.safetensors")
    else:
        weight_map = {}
        for i, shard in enumerate(shards, 1):
            file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            _save(save_file, shard, out / file)
            weight_map.update(dict.fromkeys(shard, file))
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        (out / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if tokenizer_from is not None:
        for name in TOKENIZER_FILES:
            source = Path(tokenizer_from) / name
            if source.is_file():
                shutil.copy2(source, out / name)
    return out
