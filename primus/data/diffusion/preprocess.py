"""Encode captioned videos into the latent / text-embedding cache that AutoModel's
``build_video_multiresolution_dataloader`` reads, with a Wan 2.2 pipeline's own VAE and UMT5.

Cache layout (AutoModel 0.7.0, ``components/datasets/diffusion/base_dataset.py``)::

    <cache>/metadata.json               {"shards": ["metadata_shard_0000.json", ...], ...}
    <cache>/metadata_shard_0000.json    [{"cache_file", "bucket_resolution": [W, H], "prompt", ...}]
    <cache>/<W>x<H>/<md5>.meta          torch.save({"video_latents": [1,16,F',H/8,W/8] fp16,
                                                    "text_embeddings": [1,L,D], ...})

Latents are normalised with the VAE's ``latents_mean``/``latents_std``; text embeddings are
trimmed to the prompt's tokens and zero-padded back to ``max_sequence_length``, as WanPipeline
does at inference. Re-running skips clips whose ``.meta`` file already exists (resumable).
"""
from __future__ import annotations

import hashlib
import html
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from primus.config.errors import ConfigError
from primus.data.diffusion.captions import Clip, find_clips

logger = logging.getLogger("primus.data.diffusion")

SHARD_SIZE = 10000


@dataclass(frozen=True)
class PreprocessConfig:
    videos: Path
    pipeline: Path  # local diffusers Wan 2.2 pipeline dir (vae/, text_encoder/, tokenizer/)
    output: Path
    height: int = 480
    width: int = 832
    num_frames: int = 81  # Wan's VAE needs 4k+1 frames
    max_sequence_length: int = 226
    device: str = "cpu"
    progress: bool = True

    def __post_init__(self):
        if (self.num_frames - 1) % 4:
            raise ConfigError(f"num_frames={self.num_frames}: the Wan VAE needs 4k+1 frames (e.g. 9, 33, 81)")
        if self.height % 16 or self.width % 16:
            raise ConfigError(f"height/width {self.height}x{self.width} must be multiples of 16")


class WanEncoders:
    """The pipeline's tokenizer, UMT5 text encoder and VAE, loaded once, in eval mode."""

    def __init__(self, pipeline: Path, device: str):
        import torch
        from diffusers import AutoencoderKLWan
        from transformers import AutoTokenizer, UMT5EncoderModel

        if not (Path(pipeline) / "model_index.json").exists():
            raise ConfigError(f"'{pipeline}' is not a local diffusers pipeline (no model_index.json)")
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(pipeline, subfolder="tokenizer")
        self.text_encoder = UMT5EncoderModel.from_pretrained(pipeline, subfolder="text_encoder").to(self.device).eval()
        self.vae = AutoencoderKLWan.from_pretrained(pipeline, subfolder="vae").to(self.device).eval()
        z = self.vae.config.z_dim
        self.latents_mean = torch.tensor(self.vae.config.latents_mean).view(1, z, 1, 1, 1).to(self.device)
        self.latents_std = torch.tensor(self.vae.config.latents_std).view(1, z, 1, 1, 1).to(self.device)

    def encode_text(self, prompt: str, max_len: int):
        import torch

        cleaned = re.sub(r"\s+", " ", html.unescape(html.unescape(prompt))).strip()
        tokens = self.tokenizer(cleaned, max_length=max_len, padding="max_length", truncation=True,
                                return_tensors="pt", return_attention_mask=True)
        mask = tokens["attention_mask"].to(self.device)
        with torch.no_grad():
            emb = self.text_encoder(input_ids=tokens["input_ids"].to(self.device), attention_mask=mask).last_hidden_state
        n = int(mask.sum())
        emb = emb[:, :n]
        return torch.cat([emb, emb.new_zeros(1, max_len - n, emb.shape[-1])], dim=1).cpu()

    def encode_video(self, video):
        """``video``: float [1, 3, T, H, W] in [-1, 1] -> normalised fp16 latents."""
        import torch

        with torch.no_grad():
            lat = self.vae.encode(video.to(self.device)).latent_dist.mean
        return ((lat - self.latents_mean) / self.latents_std).to(torch.float16).cpu()


def read_frames(path: Path):
    """All frames of a video as uint8 [T, H, W, 3] (imageio + the ffmpeg binary of imageio-ffmpeg)."""
    import imageio.v2 as iio
    import numpy as np

    reader = iio.get_reader(str(path), format="ffmpeg")
    try:
        return np.stack([frame[..., :3] for frame in reader])
    finally:
        reader.close()


def frames_to_video(frames, height: int, width: int, num_frames: int):
    """First ``num_frames`` frames, resized to cover HxW and centre-cropped, as [1,3,T,H,W] in [-1,1]."""
    import torch
    import torch.nn.functional as F

    video = torch.from_numpy(frames[:num_frames]).permute(0, 3, 1, 2).float()  # T,3,h,w
    h, w = video.shape[-2:]
    scale = max(height / h, width / w)
    rh, rw = max(height, round(h * scale)), max(width, round(w * scale))
    if (rh, rw) != (h, w):
        video = F.interpolate(video, size=(rh, rw), mode="bilinear", antialias=True, align_corners=False)
    top, left = (rh - height) // 2, (rw - width) // 2
    video = video[..., top:top + height, left:left + width]
    return (video / 127.5 - 1.0).clamp(-1, 1).permute(1, 0, 2, 3).unsqueeze(0)


def _cache_key(clip: Clip, cfg: PreprocessConfig) -> str:
    ident = f"{clip.video.resolve()}|{clip.caption}|{cfg.width}x{cfg.height}|{cfg.num_frames}"
    return hashlib.md5(ident.encode()).hexdigest()


def _entry(cache_file: Path, clip: Clip, cfg: PreprocessConfig, original: tuple[int, int]) -> dict[str, Any]:
    return {"cache_file": str(cache_file.resolve()), "video_path": str(clip.video), "prompt": clip.caption,
            "bucket_resolution": [cfg.width, cfg.height], "original_resolution": list(original),
            "num_frames": cfg.num_frames, "bucket_id": None, "aspect_ratio": cfg.width / cfg.height,
            "pixels": cfg.width * cfg.height, "model_type": "wan22"}


def preprocess(cfg: PreprocessConfig) -> dict[str, int]:
    """Encode every captioned clip under ``cfg.videos`` into ``cfg.output``; returns counts."""
    import torch
    from tqdm import tqdm

    clips = find_clips(cfg.videos)
    out = Path(cfg.output)
    bucket = out / f"{cfg.width}x{cfg.height}"
    bucket.mkdir(parents=True, exist_ok=True)
    encoders = None
    entries, counts = [], {"encoded": 0, "skipped_existing": 0, "skipped_short": 0}
    for clip in tqdm(clips, desc="wan-preprocess", unit="clip", disable=not cfg.progress):
        cache_file = bucket / f"{_cache_key(clip, cfg)}.meta"
        if cache_file.exists():
            original = tuple(torch.load(cache_file, weights_only=True)["original_resolution"])
            entries.append(_entry(cache_file, clip, cfg, original))
            counts["skipped_existing"] += 1
            continue
        frames = read_frames(clip.video)
        if len(frames) < cfg.num_frames:
            logger.warning("skipping %s: %d frames < num_frames=%d", clip.video, len(frames), cfg.num_frames)
            counts["skipped_short"] += 1
            continue
        encoders = encoders or WanEncoders(cfg.pipeline, cfg.device)
        video = frames_to_video(frames, cfg.height, cfg.width, cfg.num_frames)
        original = (int(frames.shape[2]), int(frames.shape[1]))
        record = {"video_latents": encoders.encode_video(video),
                  "text_embeddings": encoders.encode_text(clip.caption, cfg.max_sequence_length),
                  "first_frame": torch.from_numpy(frames[0].copy()), "original_resolution": original,
                  "bucket_resolution": (cfg.width, cfg.height), "num_frames": cfg.num_frames,
                  "prompt": clip.caption, "video_path": str(clip.video), "model_version": "wan2.2",
                  "processing_mode": "video", "model_type": "wan22", "deterministic_latents": True}
        tmp = cache_file.with_suffix(".tmp")
        torch.save(record, tmp)
        tmp.replace(cache_file)  # atomic: an interrupted run never leaves a half-written .meta
        entries.append(_entry(cache_file, clip, cfg, original))
        counts["encoded"] += 1
    if not entries:
        raise ConfigError(f"no clip in '{cfg.videos}' had at least {cfg.num_frames} frames")
    write_metadata(out, entries, model_name=str(cfg.pipeline))
    return counts


def write_metadata(out: Path, entries: list[dict[str, Any]], model_name: str) -> None:
    shards = []
    for i in range(0, len(entries), SHARD_SIZE):
        name = f"metadata_shard_{i // SHARD_SIZE:04d}.json"
        (out / name).write_text(json.dumps(entries[i:i + SHARD_SIZE], indent=1))
        shards.append(name)
    (out / "metadata.json").write_text(json.dumps(
        {"processor": "wan2.2", "model_name": model_name, "model_type": "wan22", "total_items": len(entries),
         "num_shards": len(shards), "shard_size": SHARD_SIZE, "shards": shards}, indent=1))
