#!/usr/bin/env python3
"""Generate primus/backends/torchtitan/plan_table.json: what ``primus plan`` needs of TorchTitan, read
from the installed TorchTitan once, so that planning a TorchTitan experiment imports neither torch nor
TorchTitan (2 s of CPU each).

- ``models``: every flavor of every LLM in TorchTitan's registry (``torchtitan.models.<name>.model_registry``)
  as the neutral ``ModelSpec`` Primus plans (``primus.backends.torchtitan.plan.model_spec_from_titan`` on
  the config TorchTitan itself builds), and the registry keywords each model takes;
- ``sections``: the field names of the ``Trainer.Config`` sections the plan reads (training, parallelism,
  activation_checkpoint, loss), to refuse a misspelt key there as ``config validate`` would.

Usage:
    python tools/gen_torchtitan_plan_table.py [--check]   # --check: exit 1 if the file is out of date
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "primus" / "backends" / "torchtitan" / "plan_table.json"
SECTIONS = ("training", "parallelism", "loss")


def _fail(key: str, message: str) -> Exception:
    return RuntimeError(f"{key}: {message}")


def models() -> dict:
    from primus.backends.torchtitan import registry
    from primus.backends.torchtitan.plan import model_spec_from_titan

    table = {}
    for name in registry.known_models():
        flavors, skipped = {}, {}
        try:
            names = list(registry.flavors(name))
        except ImportError as exc:  # a model whose kernels' package is not installed
            table[name] = {"keywords": [], "flavors": {}, "not_planned": {"*": f"{type(exc).__name__}: {exc}"}}
            continue
        for flavor in names:
            try:
                spec = registry.build(registry.RegistryModel(name=name, flavor=flavor), "sdpa", _fail)
                neutral = model_spec_from_titan(spec.model, f"{name} {flavor}")
            except (AttributeError, ValueError, ImportError) as exc:  # not a decoder the neutral description covers
                skipped[flavor] = f"{type(exc).__name__}: {exc}"
                continue
            flavors[flavor] = neutral.model_dump(mode="json", exclude_defaults=True)
        table[name] = {"keywords": sorted(registry.registry_keywords(name)), "flavors": flavors,
                       "not_planned": skipped}
    return table


def sections() -> dict:
    from primus.backends.torchtitan.config import AC_MODES, build_trainer_config

    cfg, _, _ = build_trainer_config({"model": {"n_layers": 1, "dim": 64, "n_heads": 4, "vocab_size": 256},
                                      "optimizer": {"lr": 1e-3}}, run_dir=Path("."), device="cpu")
    names = {section: sorted(f.name for f in dataclasses.fields(getattr(cfg, section)) if not f.name.startswith("_"))
             for section in SECTIONS}
    names["activation_checkpoint"] = ["mode"]  # Primus's key: the policy class comes from it (config.py)
    names["activation_checkpoint_modes"] = list(AC_MODES)
    return names


def generate() -> str:
    import importlib.metadata

    from primus.backends.torchtitan.patches import apply_patches

    apply_patches()
    data = {"generated_by": "tools/gen_torchtitan_plan_table.py",
            "torchtitan": importlib.metadata.version("torchtitan"),
            "sections": sections(), "models": models()}
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the file is out of date")
    args = parser.parse_args()
    text = generate()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"out of date (run tools/gen_torchtitan_plan_table.py): {OUT.relative_to(ROOT)}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
