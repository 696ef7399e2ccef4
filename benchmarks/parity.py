"""Check that the bare-engine baseline gets the *identical* native config Primus builds.

    python -m benchmarks.parity torchtitan RUN_DIR BARE_ARGS...   -> prints {"equal": ..., "diff": ...}
    python -m benchmarks.parity nemo_automodel RUN_DIR BARE_ARGS...

RUN_DIR is a finished Primus run (its config.resolved.yaml is what the worker read).
"""
from __future__ import annotations

import difflib
import re
import json
import sys
from pathlib import Path

import yaml


def _diff(a: str, b: str) -> list[str]:
    return [line for line in difflib.unified_diff(a.splitlines(), b.splitlines(), "primus", "bare", lineterm="", n=0)
            if not line.startswith(("---", "+++", "@@"))][:20]


def torchtitan(run_dir: Path, bare_argv: list[str]) -> dict:
    from primus.backends.torchtitan.patches import apply_patches

    apply_patches()
    from benchmarks.bare import torchtitan_bare
    from primus.backends.torchtitan.adapter import _with_tiny_assets
    from primus.backends.torchtitan.config import build_trainer_config

    params = yaml.safe_load((run_dir / "config.resolved.yaml").read_text())["modules"]["pre_trainer"]["params"]
    args = torchtitan_bare.parse_args(bare_argv)
    primus_cfg, _, _ = build_trainer_config(_with_tiny_assets(params), run_dir=Path(args.dump).absolute(),
                                            device="cpu")
    bare_cfg = torchtitan_bare.build_config(args)
    # closures built per call differ only by address: compare everything else
    a, b = (re.sub(r" at 0x[0-9a-f]+", "", repr(c)) for c in (primus_cfg, bare_cfg))
    return {"equal": a == b, "diff": _diff(a.replace(", ", ",\n"), b.replace(", ", ",\n"))}


def nemo_automodel(run_dir: Path, bare_argv: list[str]) -> dict:
    import argparse

    from benchmarks.bare.automodel_bare import load_config
    from primus.backends.nemo_automodel.config import build_handoff

    p = argparse.ArgumentParser()
    p.add_argument("--assets")
    p.add_argument("--run-dir")
    p.add_argument("--set", action="append", default=[], dest="sets")
    args = p.parse_args(bare_argv)
    params = yaml.safe_load((run_dir / "config.resolved.yaml").read_text())["modules"]["pre_trainer"]["params"]
    bare_run = str(Path(args.run_dir).absolute())
    handoff = build_handoff(params, stage="pretrain", checkpoint_dir=Path(bare_run) / "checkpoints", resume=False,
                            dist_backend="gloo", log=lambda m: None, log_derived=lambda *a: None).automodel
    bare = load_config(args.assets, bare_run, args.sets)
    a, b = yaml.safe_dump(handoff, sort_keys=True), yaml.safe_dump(bare, sort_keys=True)
    return {"equal": a == b, "diff": _diff(a, b)}


if __name__ == "__main__":
    backend, run_dir, *rest = sys.argv[1:]
    print(json.dumps(globals()[backend](Path(run_dir), rest)))
