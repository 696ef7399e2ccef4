"""Shared fixtures: one tiny random Wan 2.2 pipeline + latent cache per test session, and the tiny
CPU example resolved by the real config engine."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytest.importorskip("nemo_automodel", reason="the automodel stack is installed by `primus prepare automodel`")

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "nemo_automodel" / "wan2_2_tiny-cpu.yaml"


def dotted_tokens(tree: dict, prefix: str = "") -> list[str]:
    """``{"a": {"b": 1}}`` -> ``["a.b=1"]``: nested overrides as command-line tokens."""
    tokens = []
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            tokens += dotted_tokens(value, f"{dotted}.")
        else:
            tokens.append(f"{dotted}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}")
    return tokens


def resolve_example(path: Path, **overrides) -> tuple[str, dict]:
    """(stage, params) of an example's pre_trainer module, as `primus train` resolves it."""
    from primus.compat import AMD_PRIMUS
    from primus.config.resolve import resolve_experiment
    from primus.runtime.registry import backend_defaults

    from primus.config.schema import ExperimentSpec

    tokens = []
    for key, value in overrides.items():  # a section named like an experiment key needs the module's path
        prefix = "modules.pre_trainer." if key in ExperimentSpec.model_fields else ""
        tokens += dotted_tokens({key: value}, prefix)
    resolved = resolve_experiment(path, tokens, backend_defaults, dialect=AMD_PRIMUS)
    module = resolved.modules["pre_trainer"]
    return module.stage, module.params


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    from primus.backends.nemo_automodel.recipes.diffusion import ensure_tiny_assets

    root = tmp_path_factory.mktemp("wan2_2_tiny")
    ensure_tiny_assets(root, print)  # what a fresh `primus train` does in its launcher
    assert (root / ".complete").exists() and (root / "cache" / "metadata.json").exists()
    return root


@pytest.fixture
def tiny_params(tiny_root):
    """(stage, params) of the tiny CPU example pointed at the session's assets, 2 steps by default."""
    from tests.helpers import ROOT  # noqa: F401  (the repo root is importable)

    def make(**overrides):
        base = {"primus": {"tiny_assets": str(tiny_root)},
                "model": {"pretrained_model_name_or_path": str(tiny_root / "pipeline")},
                "data": {"dataloader": {"cache_dir": str(tiny_root / "cache")}},
                "step_scheduler": {"max_steps": 2, "ckpt_every_steps": 2}}
        return resolve_example(EXAMPLE, **_merge(base, overrides))

    return make


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
