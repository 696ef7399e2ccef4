"""``primus data wan-preprocess`` and ``primus data wan-tiny``: the CLI hooks the lead wires in.

``register(subparsers)`` takes the sub-parsers object of ``primus data`` and sets each
command's ``func`` to a callable ``(args) -> int``.
"""
from __future__ import annotations

import argparse
from pathlib import Path


def _preprocess(args: argparse.Namespace, _overrides: list[str] | None = None) -> int:
    from primus.data.diffusion.preprocess import PreprocessConfig, preprocess

    counts = preprocess(PreprocessConfig(
        videos=Path(args.videos), pipeline=Path(args.pipeline), output=Path(args.output), height=args.height,
        width=args.width, num_frames=args.num_frames, max_sequence_length=args.max_sequence_length,
        device=args.device, progress=not args.no_progress))
    print(f"wan-preprocess: {counts['encoded']} encoded, {counts['skipped_existing']} already cached, "
          f"{counts['skipped_short']} too short -> {args.output}")
    return 0


def _tiny(args: argparse.Namespace, _overrides: list[str] | None = None) -> int:
    from primus.data.diffusion.tiny import build_tiny_assets, build_tiny_pipeline, write_synthetic_clips

    out = Path(args.output)
    if args.only == "pipeline":
        print(f"wan-tiny: pipeline -> {build_tiny_pipeline(out / 'pipeline')}")
    elif args.only == "videos":
        print(f"wan-tiny: clips -> {write_synthetic_clips(out / 'videos', args.caption_format, n=args.clips)}")
    else:
        pipeline, cache = build_tiny_assets(out, clips=args.clips, progress=True)
        print(f"wan-tiny: pipeline -> {pipeline}\nwan-tiny: latent cache -> {cache}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "wan-preprocess", help="encode captioned videos into AutoModel's Wan 2.2 latent cache",
        description="Caption formats: meta.json [{file_name,text}], metadata.csv (file_name,text), "
                    "or a .txt next to each video. Clips already in the cache are skipped.")
    p.add_argument("videos", help="folder of videos and captions")
    p.add_argument("--pipeline", required=True, help="local Wan 2.2 diffusers pipeline dir (vae, text_encoder)")
    p.add_argument("--output", "-o", required=True, help="cache dir (data.dataloader.cache_dir)")
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--width", type=int, default=832)
    p.add_argument("--num-frames", type=int, default=81, help="4k+1 frames per clip")
    p.add_argument("--max-sequence-length", type=int, default=226)
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(handler=_preprocess)

    t = subparsers.add_parser("wan-tiny", help="build a tiny random two-expert Wan 2.2 pipeline + synthetic cache")
    t.add_argument("--output", "-o", required=True, help="folder for pipeline/, videos/ and cache/")
    t.add_argument("--clips", type=int, default=4)
    t.add_argument("--only", choices=("pipeline", "videos"), help="build only this part")
    t.add_argument("--caption-format", choices=("meta_json", "csv", "txt"), default="meta_json",
                   help="with --only videos")
    t.set_defaults(handler=_tiny)
