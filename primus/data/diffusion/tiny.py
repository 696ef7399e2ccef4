"""A tiny, random, two-expert Wan 2.2 T2V pipeline plus synthetic captioned clips, built locally.

Same architecture family and layout as Wan-AI/Wan2.2-T2V-A14B-Diffusers (UMT5 text encoder,
Wan VAE with 8x spatial / 4x temporal compression and z_dim 16, ``transformer`` = high-noise
expert, ``transformer_2`` = low-noise expert, ``boundary_ratio``), only with toy widths, so a
demo or a test trains in seconds on a CPU. Nothing is downloaded.
"""
from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

logger = logging.getLogger("primus.data.diffusion")

TEXT_DIM = 32
BOUNDARY_RATIO = 0.875
TINY_TRANSFORMER = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=16,
                        out_channels=16, text_dim=TEXT_DIM, freq_dim=32, ffn_dim=64, num_layers=2,
                        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=64)
CAPTIONS = [
    "a red ball bouncing on a wooden floor",
    "a cat walking through tall green grass",
    "waves rolling onto a sandy beach at sunset",
    "a car driving along a mountain road",
]
CAPTION_FORMATS = ("meta_json", "csv", "txt")
_EXTRA_WORDS = "the a an of on in at to and with is are through along onto over under".split()


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for c in CAPTIONS for w in c.split()} | set(_EXTRA_WORDS))
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=512)


def build_tiny_pipeline(out: Path, seed: int = 0, transformer: dict | None = None) -> Path:
    """Save a random tiny Wan 2.2 pipeline as a local diffusers directory (``model_index.json``).

    ``transformer`` overrides keys of ``TINY_TRANSFORMER`` for both experts (e.g. a wider one for
    benchmarks); the text encoder, VAE and so the latent cache stay the same."""
    experts = {**TINY_TRANSFORMER, **(transformer or {})}
    import torch
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(seed)
    tok = _tokenizer()
    text_encoder = UMT5EncoderModel(UMT5Config(
        vocab_size=len(tok), d_model=TEXT_DIM, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=32, feed_forward_proj="gated-gelu",
        is_encoder_decoder=False, use_cache=False)).eval()
    vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
                           temperal_downsample=[False, True, True]).eval()
    pipe = WanPipeline(tokenizer=tok, text_encoder=text_encoder, vae=vae,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
                       transformer=WanTransformer3DModel(**experts),
                       transformer_2=WanTransformer3DModel(**experts), boundary_ratio=BOUNDARY_RATIO)
    out.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(out)
    return out


def _synthetic_frames(i: int, frames: int, size: int):
    """A coloured square moving across a dark background: uint8 [T, H, W, 3]."""
    import numpy as np

    video = np.full((frames, size, size, 3), 16, np.uint8)
    side = size // 4
    for t in range(frames):
        x = (4 * t + 8 * i) % (size - side)
        video[t, side:2 * side, x:x + side] = [(60 * i) % 255, 200, max(0, 255 - 25 * t)]
    return video


def write_synthetic_clips(folder: Path, caption_format: str = "meta_json", n: int = 4, frames: int = 9,
                          size: int = 64) -> Path:
    """``n`` mp4 clips with captions in one of the formats ``find_clips`` reads."""
    import imageio.v2 as iio

    if caption_format not in CAPTION_FORMATS:
        raise ValueError(f"caption_format must be one of {CAPTION_FORMATS}")
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        name, caption = f"clip_{i:03d}.mp4", CAPTIONS[i % len(CAPTIONS)]
        writer = iio.get_writer(str(folder / name), format="ffmpeg", fps=8, codec="libx264", quality=8,
                                macro_block_size=16, ffmpeg_log_level="error")
        for frame in _synthetic_frames(i, frames, size):
            writer.append_data(frame)
        writer.close()
        rows.append({"file_name": name, "text": caption})
        if caption_format == "txt":
            (folder / name).with_suffix(".txt").write_text(caption + "\n")
    if caption_format == "meta_json":
        (folder / "meta.json").write_text(json.dumps(rows, indent=1))
    elif caption_format == "csv":
        with (folder / "metadata.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["file_name", "text"])
            writer.writeheader()
            writer.writerows(rows)
    return folder


def build_tiny_assets(root: Path, *, clips: int = 4, progress: bool = False,
                      transformer: dict | None = None) -> tuple[Path, Path]:
    """``root/pipeline``, ``root/videos`` and ``root/cache`` (the pipeline's own encoders fill the cache).

    Idempotent: what already exists is kept. Returns (pipeline_dir, cache_dir).
    """
    from primus.data.diffusion.preprocess import PreprocessConfig, preprocess

    root = Path(root)
    pipeline, videos, cache = root / "pipeline", root / "videos", root / "cache"
    if not (pipeline / "model_index.json").exists():
        build_tiny_pipeline(pipeline, transformer=transformer)
    if not any(videos.glob("*.mp4")):
        write_synthetic_clips(videos, n=clips)
    if not (cache / "metadata.json").exists():
        preprocess(PreprocessConfig(videos=videos, pipeline=pipeline, output=cache, height=64, width=64,
                                    num_frames=9, progress=progress))
    return pipeline, cache
