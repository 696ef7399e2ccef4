"""NeMo AutoModel 0.7.0 driven directly: native YAML -> ``ConfigNode`` -> ``TrainDiffusionRecipe``.

The baseline for Primus's overhead on the AutoModel backend. AutoModel runs unmodified on CPU,
so nothing from Primus is imported here. ``--set a.b=value`` applies the same dotted overrides
the harness gives ``primus train`` (values parsed as YAML).

    python -m benchmarks.bare.automodel_bare --assets ~/.cache/primus/nemo_automodel/wan2_2_tiny \
        --run-dir /tmp/am --set step_scheduler.max_steps=10
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import yaml

NATIVE = Path(__file__).with_name("automodel_wan_tiny.yaml")


def load_config(assets: str, run_dir: str, sets: list[str], path: Path = NATIVE) -> dict:
    text = path.read_text().replace("${ASSETS}", str(Path(assets).expanduser())).replace("${RUN_DIR}", run_dir)
    cfg = yaml.safe_load(text)
    for item in sets:
        key, _, value = item.partition("=")
        node = cfg
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return cfg


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--assets", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--set", action="append", default=[], dest="sets")
    args = p.parse_args(argv)
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": os.environ.get("MASTER_PORT", "29532")}.items():
        os.environ.setdefault(key, value)
    from nemo_automodel.components.config.loader import ConfigNode
    from nemo_automodel.recipes.diffusion.train import TrainDiffusionRecipe

    recipe = TrainDiffusionRecipe(ConfigNode(load_config(args.assets, str(Path(args.run_dir).absolute()), args.sets)))
    recipe.setup()
    recipe.run_train_validation_loop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
