"""``primus export RUN_DIR [--step N] --to hf OUT_DIR``: a run's checkpoint as a Hugging Face model."""
from __future__ import annotations

import argparse

from primus.config.values import count_flag
from primus.runtime.rundir import RunDir

FORMATS = ("hf",)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export", allow_abbrev=False, help="write a run's checkpoint as a Hugging Face model folder",
        description=f"Read RUN_DIR's {RunDir.CONFIG} and its checkpoint (latest, or --step N; any TP/PP "
                    "layout, Megatron torch_dist or TorchTitan DCP) and write config.json + *.safetensors + "
                    "the tokenizer files to OUT_DIR, loadable with transformers' from_pretrained.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory ({workspace}/{group}/{user}/{exp})")
    parser.add_argument("--to", nargs=2, metavar=("FORMAT", "OUT_DIR"), required=True,
                        help="'hf' and the output folder (new or empty)")
    parser.add_argument("--step", type=count_flag(0), help="checkpoint step (default: the latest whole one)")
    parser.add_argument("--module", help="module of the run (default: pre_trainer)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                        help="cast the weights (default: as stored in the checkpoint)")
    parser.set_defaults(handler=_export)


def _export(args: argparse.Namespace, _overrides: list[str]) -> int:
    from primus.config.errors import ConfigError

    fmt, out_dir = args.to
    if fmt not in FORMATS:
        raise ConfigError(f"--to {fmt}: unknown format (supported: {', '.join(FORMATS)})")
    from primus.hf.export import export_run

    result = export_run(args.run_dir, out_dir, step=args.step, module=args.module, dtype=args.dtype,
                        warn=lambda line: print(f"[primus] warning: {line}", flush=True))
    print(f"[primus] exported {result.checkpoint} (step {result.step}, {result.tensors} tensors) -> {result.out_dir}")
    return 0
