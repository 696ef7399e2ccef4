#!/usr/bin/env python3
"""Generate AMD Primus's Megatron module presets (primus/configs/modules/megatron/amd/{trainer_base,pre_trainer,
sft_trainer}.yaml) from its files of the same names, so that an experiment in AMD Primus's format (one that
carries an AMD Primus-only key, ``primus.compat.dialect``) gets AMD Primus's defaults from ``config:
pre_trainer.yaml``; Primus's own experiments keep Primus's presets of those names (one folder up).

AMD Primus (``primus/configs/modules/megatron/<name>.yaml`` at the commit below) resolves each file's
``extends:`` chain with a deep merge (later wins, the file last) and hands Megatron-LM only the keys that
are Megatron-LM argparse dests (its ``MegatronArgBuilder``); the rest are its own switches (read by its
patches, all off here) or dropped. Each generated file is that merge, flattened (read as plain YAML), with:

- the Megatron-LM d3528a2 arguments whose value is not Megatron-LM's default (a default needs no line;
  ``null`` for an argument Megatron-LM defaults to a value is left out: Megatron-LM's command line cannot
  say null, and Primus's Megatron backend keeps the default, said in a ``derived`` line);
- ``stage`` (``sft_trainer.yaml`` names its stage);
- AMD Primus's own keys left out, named in the header: what each does when an experiment sets it is
  ``primus/compat/megatron.py``'s business.

    python tools/gen_module_presets.py [--git-dir AMD_PRIMUS_GIT_DIR] [--commit fd1eeab] [--check]
"""
from __future__ import annotations

import argparse
import difflib
import os
import posixpath
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SOURCE_REPO = "AMD-AGI/Primus"
SOURCE_DIR = "primus/configs/modules/megatron"
SOURCE_COMMIT = "fd1eeabbad15135e3702094087e96142b4b4eacb"
DEFAULT_GIT_DIR = os.environ.get("AMD_PRIMUS_GIT_DIR", "/work/.mirror/AMD-AGI+Primus/repo")
OUT_DIR = REPO / "primus" / "configs" / "modules" / "megatron" / "amd"
NAMES = ("trainer_base.yaml", "pre_trainer.yaml", "sft_trainer.yaml")
KEPT_AMD_KEYS = ("stage",)
_ENV = re.compile(r"\$\{([^:{}]+)(?::([^}]*))?}")


def git_show(git_dir: str, commit: str, path: str) -> str:
    result = subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"gen_module_presets: cannot read {path} at {commit} from {git_dir}: {result.stderr.strip()}")
    return result.stdout


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """AMD Primus's ``merge_utils.deep_merge``: override wins, nested mappings merged."""
    out = dict(base)
    for key, value in override.items():
        out[key] = deep_merge(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, dict) else value
    return out


def _no_env(value: Any) -> Any:
    """``${VAR:default}`` as AMD Primus reads it with VAR unset (a preset has none today)."""
    if isinstance(value, str) and _ENV.search(value):
        raise SystemExit(f"gen_module_presets: an environment reference in a preset: {value!r}")
    return value


def resolve(git_dir: str, commit: str, path: str) -> tuple[dict[str, Any], list[str]]:
    """AMD Primus's ``yaml_loader.parse_yaml`` of ``path``: parents (``extends:``, relative) first, the file last."""
    data = yaml.safe_load(git_show(git_dir, commit, path)) or {}
    parents = data.pop("extends", None) or []
    merged: dict[str, Any] = {}
    chain = [posixpath.relpath(path, SOURCE_DIR)]
    for parent in [parents] if isinstance(parents, str) else parents:
        values, parent_chain = resolve(git_dir, commit, posixpath.normpath(posixpath.join(posixpath.dirname(path),
                                                                                          parent)))
        merged = deep_merge(merged, values)
        chain += parent_chain
    return deep_merge(merged, {k: _no_env(v) for k, v in data.items()}), chain


def reduce(amd: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """(kept Megatron-LM arguments and stage, AMD-only keys left out, null-for-a-default keys left out)."""
    from primus.backends.megatron.schema import megatron_lm_table

    table = megatron_lm_table()
    kept, amd_only, nulls = {}, [], []
    for key, value in amd.items():
        if key in KEPT_AMD_KEYS:
            kept[key] = value
        elif key not in table:
            amd_only.append(key)
        elif value is None and table[key].default is not None:
            nulls.append(key)
        elif value != table[key].default and not (isinstance(table[key].default, tuple)
                                                  and list(table[key].default) == value):
            kept[key] = value
    return kept, amd_only, nulls


def render(name: str, kept: dict[str, Any], amd_only: list[str], nulls: list[str], chain: list[str],
           commit: str) -> str:
    lines = [
        f"# AMD Primus's Megatron module preset {name}, as AMD Primus resolves it (config: {name} in a file in",
        "# AMD Primus's format: primus/compat/dialect.py).",
        "# GENERATED by tools/gen_module_presets.py -- do not edit; regenerate instead.",
        f"# Source: {SOURCE_REPO} {SOURCE_DIR}/{name} at {commit}",
        f"#   resolved through: {' <- '.join(chain)} (flattened: no extends)",
        "# Kept: the Megatron-LM d3528a2 arguments whose value is not Megatron-LM's default.",
        f"# Left out, null for an argument with a default (Megatron-LM's default runs): {', '.join(nulls) or 'none'}",
        f"# Left out, AMD Primus's own keys ({len(amd_only)}: Primus-Turbo, zero-bubble and Primus pipeline "
        "switches, logging sinks, ...; all off or",
        "#   AMD-internal here; primus/compat/megatron.py says what each does when an experiment sets it).",
    ]
    return "\n".join(lines) + "\n" + yaml.safe_dump(kept, sort_keys=False, default_flow_style=False, width=120)


def generate(git_dir: str = DEFAULT_GIT_DIR, commit: str = SOURCE_COMMIT) -> dict[str, str]:
    full = subprocess.run(["git", "--git-dir", git_dir, "rev-parse", commit], capture_output=True, text=True)
    if full.returncode != 0:
        raise SystemExit(f"gen_module_presets: no commit {commit} in {git_dir}")
    commit = full.stdout.strip()
    files = {}
    for name in NAMES:
        amd, chain = resolve(git_dir, commit, f"{SOURCE_DIR}/{name}")
        files[name] = render(name, *reduce(amd), chain, commit)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git-dir", default=DEFAULT_GIT_DIR, help="AMD Primus git directory (a bare mirror is fine)")
    parser.add_argument("--commit", default=SOURCE_COMMIT)
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument("--check", action="store_true", help="compare with --out; exit 1 on a difference")
    args = parser.parse_args(argv)
    stale = []
    for name, text in generate(args.git_dir, args.commit).items():
        path = args.out / name
        if args.check:
            current = path.read_text() if path.exists() else ""
            if current != text:
                stale.append(name)
                sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True), str(path), name))
        else:
            path.write_text(text)
    if stale:
        print(f"gen_module_presets: {len(stale)} preset(s) differ from a fresh generation: {', '.join(stale)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
