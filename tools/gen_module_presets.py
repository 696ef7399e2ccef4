#!/usr/bin/env python3
"""Generate AMD Primus's Megatron, TorchTitan and NeMo AutoModel module presets (primus/configs/modules/megatron/
amd/{trainer_base,pre_trainer,sft_trainer}.yaml, primus/configs/modules/{torchtitan,nemo_automodel}/amd/
pre_trainer.yaml, and AutoModel's model preset primus/configs/models/nemo_automodel/amd/wan2_2_t2v_a14b.yaml) from
its files of the same names, so that an experiment in AMD Primus's format (one that carries an AMD Primus-only key,
``primus.compat.dialect``) gets AMD Primus's defaults from ``config: pre_trainer.yaml``; Primus's own
experiments keep Primus's presets of those names (one folder up).

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

TorchTitan (``--framework torchtitan``): AMD Primus's ``primus/configs/modules/torchtitan/pre_trainer.yaml``
(``extends:`` ``../module_base.yaml`` and ``quantize.yaml``), merged the same way, into
``primus/configs/modules/torchtitan/amd/pre_trainer.yaml``. Its keys are TorchTitan 0.2's; each goes through
the compat rules an experiment's key goes through (``primus/compat/torchtitan.py``: ``beta1``/``beta2`` ->
``betas``, ``profiling`` -> ``profiler``, ``training.mock_data: true`` -> ``dataloader.dataset: mock``, ...),
then the file keeps:

- Primus's TorchTitan shortcuts (``optimizer.{name,lr,betas,eps,weight_decay}``, ``activation_checkpoint.mode``);
- the TorchTitan 0.3.0 ``Trainer.Config`` fields whose value is not TorchTitan 0.3.0's default;
- the keys a rule says have no effect here (AMD Primus's own, 0.2 settings 0.3.0 dropped) left out, named in
  the header. Two AMD values the file cannot hold in our names, because they act only beside another key
  (``training.dataset`` with ``mock_data: false``, ``selective_ac_option`` with ``mode: selective``), are
  ``primus.compat.torchtitan.AMD_PRESET``: checked here against AMD's file.

NeMo AutoModel (``--framework nemo_automodel``): AMD Primus's ``primus/configs/modules/nemo_automodel/
pre_trainer.yaml`` (``extends:`` ``../module_base.yaml``) and its one AutoModel model preset
``primus/configs/models/nemo_automodel/wan2_2_t2v_a14b.yaml``, merged the same way. AMD Primus hands that tree to
AutoModel as it is (its ``strip_primus_keys`` drops the module-base keys), so each file keeps every key, in
AutoModel 0.7.0's names after the compat rules (``primus/compat/nemo_automodel.py``: ``optim.*`` ->
``optimizer.*``, ``step_scheduler.log_every`` -> ``log_remote_every_steps``, ``wandb.enable: false`` drops the
``wandb:`` block, ``model.mode`` is the stage), numbers as AutoModel's loader reads them (``5e-5``, a string to
YAML 1.1, is the float 5e-05 in its ``ConfigNode``), and checked against what AutoModel 0.7.0 reads
(``primus/backends/nemo_automodel/schema.py``). The model preset goes to ``models/nemo_automodel/amd/``: a module
in AMD Primus's format reads it before Primus's preset of that name (``primus/config/resolve.py``).

    python tools/gen_module_presets.py [--framework megatron|torchtitan|nemo_automodel] [--git-dir AMD_PRIMUS_GIT_DIR]
                                       [--commit fd1eeab] [--check]
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import difflib
import io
import os
import posixpath
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SOURCE_REPO = "AMD-AGI/Primus"
SOURCE_COMMIT = "fd1eeabbad15135e3702094087e96142b4b4eacb"
DEFAULT_GIT_DIR = os.environ.get("AMD_PRIMUS_GIT_DIR", "/work/.mirror/AMD-AGI+Primus/repo")
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


def resolve(git_dir: str, commit: str, path: str, source_dir: str) -> tuple[dict[str, Any], list[str]]:
    """AMD Primus's ``yaml_loader.parse_yaml`` of ``path``: parents (``extends:``, relative) first, the file last."""
    data = yaml.safe_load(git_show(git_dir, commit, path)) or {}
    parents = data.pop("extends", None) or []
    merged: dict[str, Any] = {}
    chain = [posixpath.relpath(path, source_dir)]
    for parent in [parents] if isinstance(parents, str) else parents:
        values, parent_chain = resolve(git_dir, commit, posixpath.normpath(posixpath.join(posixpath.dirname(path),
                                                                                          parent)), source_dir)
        merged = deep_merge(merged, values)
        chain += parent_chain
    return deep_merge(merged, {k: _no_env(v) for k, v in data.items()}), chain


def reduce_megatron(amd: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
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


def render_megatron(name: str, amd: dict[str, Any], chain: list[str], commit: str) -> str:
    kept, amd_only, nulls = reduce_megatron(amd)
    lines = [
        *_head("megatron", name, chain, commit),
        "# Kept: the Megatron-LM d3528a2 arguments whose value is not Megatron-LM's default.",
        f"# Left out, null for an argument with a default (Megatron-LM's default runs): {', '.join(nulls) or 'none'}",
        f"# Left out, AMD Primus's own keys ({len(amd_only)}: Primus-Turbo, zero-bubble and Primus pipeline "
        "switches, logging sinks, ...; all off or",
        "#   AMD-internal here; primus/compat/megatron.py says what each does when an experiment sets it).",
    ]
    return "\n".join(lines) + "\n" + yaml.safe_dump(kept, sort_keys=False, default_flow_style=False, width=120)


def _head(framework: str, name: str, chain: list[str], commit: str, source_dir: str = "") -> list[str]:
    title = {"megatron": "Megatron", "torchtitan": "TorchTitan", "nemo_automodel": "NeMo AutoModel"}[framework]
    kind, key = ("model", "model") if source_dir else ("module", "config")
    return [
        f"# AMD Primus's {title} {kind} preset {name}, as AMD Primus resolves it ({key}: {name} in a file in",
        "# AMD Primus's format: primus/compat/dialect.py).",
        "# GENERATED by tools/gen_module_presets.py -- do not edit; regenerate instead.",
        f"# Source: {SOURCE_REPO} {source_dir or FRAMEWORKS[framework].source_dir}/{name} at {commit}",
        f"#   resolved through: {' <- '.join(chain)} (flattened: no extends)",
    ]


# -- TorchTitan ------------------------------------------------------------------------------------------------

def translate_torchtitan(amd: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """AMD's TorchTitan 0.2 settings through the compat rules an experiment's keys go through, as a module in
    AMD Primus's format: (our settings, the translations)."""
    from primus.compat import translate_module
    from primus.config.provenance import Provenance

    params = copy.deepcopy(amd)
    _, translations = translate_module("pre_trainer", "torchtitan", params, stage="pretrain", stage_explicit=False,
                                       experiment={"logging": {}}, provenance=Provenance(), amd_format=True)
    return params, translations


def _torchtitan_defaults() -> Any:
    """A fresh TorchTitan 0.3.0 ``Trainer.Config`` with the pretraining recipe's dataloader: the defaults."""
    from primus.runtime.registry import get_adapter

    get_adapter("torchtitan", "framework").import_engine()  # torchtitan imports triton: a stand-in on a CPU host
    from torchtitan.trainer import Trainer

    from primus.backends.torchtitan.data import PrimusTextDataLoader

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return Trainer.Config(dataloader=PrimusTextDataLoader.Config())


def reduce_torchtitan(params: dict[str, Any]) -> dict[str, Any]:
    """Primus's shortcuts, and the TorchTitan 0.3.0 fields whose value is not TorchTitan 0.3.0's default."""
    from primus.backends.torchtitan.config import OPTIMIZER_SHORTCUTS

    shortcuts = {*(f"optimizer.{name}" for name in OPTIMIZER_SHORTCUTS), "activation_checkpoint.mode"}
    defaults = _torchtitan_defaults()
    kept: dict[str, Any] = {}

    def walk(node: dict[str, Any], path: str, config: Any) -> None:
        for key, value in node.items():
            dotted = f"{path}.{key}" if path else key
            fields = {f.name for f in dataclasses.fields(config)} if dataclasses.is_dataclass(config) else set()
            if dotted in shortcuts:
                kept.setdefault(path, {})[key] = value
            elif key not in fields:
                raise SystemExit(f"gen_module_presets: AMD's {dotted} is no TorchTitan 0.3.0 field and no compat "
                                 "rule covers it: add one to primus/compat/torchtitan.py")
            elif isinstance(value, dict) and dataclasses.is_dataclass(getattr(config, key)):
                walk(value, dotted, getattr(config, key))
            elif _differs(value, getattr(config, key)):
                kept.setdefault(path, {})[key] = value

    walk(params, "", defaults)
    out: dict[str, Any] = {}
    for path, values in kept.items():  # nested again, sections in AMD's order
        node = out
        for part in path.split("."):
            node = node.setdefault(part, {})
        node.update(values)
    return out


def _differs(value: Any, default: Any) -> bool:
    return not (value == default or (isinstance(default, tuple) and list(default) == value))


def _left_out(amd: dict[str, Any], translations: list[Any], said: set[str]) -> list[str]:
    """The AMD keys a rule says have no effect here (less ``said``), a whole section of them as ``section.*``."""
    gone = list(dict.fromkeys(t.source for t in translations if t.target is None and t.source not in said))
    out: list[str] = []
    for key in gone:
        section = key.split(".")[0]
        whole = isinstance(amd.get(section), dict) and all(
            any(leaf == g or leaf.startswith(f"{g}.") for g in gone) for leaf in _leaves(amd[section], section))
        name = f"{section}.*" if whole else key
        if name not in out:
            out.append(name)
    return sorted(out, key=lambda name: list(amd).index(name.split(".")[0]))


def _leaves(node: dict[str, Any], path: str) -> list[str]:
    out = []
    for key, value in node.items():
        dotted = f"{path}.{key}"
        out += _leaves(value, dotted) if isinstance(value, dict) and value else [dotted]
    return out


def render_torchtitan(name: str, amd: dict[str, Any], chain: list[str], commit: str) -> str:
    from primus.compat.torchtitan import AMD_PRESET

    for key, value in AMD_PRESET.items():
        node: Any = amd
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node != value:
            raise SystemExit(f"gen_module_presets: AMD's {name} has {key}: {node!r}; primus.compat.torchtitan."
                             f"AMD_PRESET says {value!r}: update it")
    params, translations = translate_torchtitan(amd)
    kept = reduce_torchtitan(params)
    left_out = _left_out(amd, translations, set(AMD_PRESET))
    lines = [
        "# TorchTitan 0.2 names translated by primus/compat/torchtitan.py (training.mock_data: true is dataloader.dataset:",
        "#   mock, whatever training.dataset names). Kept: Primus's optimizer / activation-checkpoint shortcuts and the",
        "#   TorchTitan 0.3.0 fields whose value is not TorchTitan 0.3.0's default.",
        "# Read only beside another key (primus.compat.torchtitan.AMD_PRESET): "
        + ", ".join(f"{k}: {v}" for k, v in AMD_PRESET.items()),
        f"# Left out, no effect here ({len(left_out)}; primus/compat/torchtitan.py says why): {', '.join(left_out)}",
    ]
    return "\n".join([*_head("torchtitan", name, chain, commit), *_wrap(lines)]) + "\n" + yaml.safe_dump(
        kept, sort_keys=False, default_flow_style=None, width=120)


def _wrap(lines: list[str], width: int = 120) -> list[str]:
    out = []
    for line in lines:
        while len(line) > width:
            cut = line.rfind(" ", 0, width)
            out.append(line[:cut])
            line = "#   " + line[cut + 1:]
        out.append(line)
    return out


# -- NeMo AutoModel ------------------------------------------------------------------------------------------

AUTOMODEL_MODELS = "primus/configs/models/nemo_automodel"


def translate_automodel(amd: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """AMD's AutoModel keys through the compat rules an experiment's keys go through (AMD Primus's format)."""
    from primus.compat import translate_module
    from primus.config.provenance import Provenance

    params = _as_automodel_reads(copy.deepcopy(amd))
    _, translations = translate_module("pre_trainer", "nemo_automodel", params, stage="pretrain",
                                       stage_explicit=False, experiment={"logging": {}}, provenance=Provenance(),
                                       amd_format=True)
    return params, translations


def _as_automodel_reads(value: Any) -> Any:
    """A string AutoModel's ``ConfigNode`` reads as a number (``5e-5``, a string to YAML 1.1) as that number."""
    from nemo_automodel.components.config.loader import translate_value

    if isinstance(value, dict):
        return {k: _as_automodel_reads(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_automodel_reads(v) for v in value]
    read = translate_value(value) if isinstance(value, str) else value
    return read if isinstance(read, (int, float)) and not isinstance(read, bool) else value


def _automodel_checked(params: dict[str, Any], name: str) -> None:
    from primus.backends.nemo_automodel import schema
    from primus.config.errors import ConfigError

    try:
        schema.check(params)
    except ConfigError as exc:
        raise SystemExit(f"gen_module_presets: AMD's {name} holds a key AutoModel 0.7.0 does not read, and no "
                         f"compat rule covers it (primus/compat/nemo_automodel.py): {exc}") from None


def render_automodel(name: str, amd: dict[str, Any], chain: list[str], commit: str, source_dir: str = "") -> str:
    params, translations = translate_automodel(amd)
    _automodel_checked(params, name)
    left_out = _left_out(amd, translations, set())
    stage = [t for t in translations if t.kind == "stage"]
    lines = [
        "# Every key AMD Primus hands AutoModel, in AutoModel 0.7.0's names (primus/compat/nemo_automodel.py); numbers as",
        "#   AutoModel's ConfigNode reads them.",
        f"# Left out, no effect here ({len(left_out)}; primus/compat says why): {', '.join(left_out) or 'none'}",
    ]
    if stage:
        lines.append(f"# model.mode: {stage[0].value} is the module's stage (Primus sets model.mode from the stage)")
    head = _head("nemo_automodel", name, chain, commit, source_dir)
    head = [f"{head[0]} {head[1][2:]}", *head[2:]]  # one sentence, wrapped once
    return "\n".join(_wrap([*head, *lines])) + "\n" + \
        yaml.safe_dump(params, sort_keys=False, default_flow_style=None, width=120)


@dataclass(frozen=True)
class Framework:
    source_dir: str
    out_dir: Path
    names: tuple[str, ...]
    render: Callable[..., str]
    models: tuple[str, ...] = ()  # AMD's model presets of this framework, generated beside Primus's


FRAMEWORKS = {
    "megatron": Framework("primus/configs/modules/megatron", REPO / "primus" / "configs" / "modules" / "megatron" / "amd",
                          ("trainer_base.yaml", "pre_trainer.yaml", "sft_trainer.yaml"), render_megatron),
    "torchtitan": Framework("primus/configs/modules/torchtitan",
                            REPO / "primus" / "configs" / "modules" / "torchtitan" / "amd", ("pre_trainer.yaml",),
                            render_torchtitan),
    "nemo_automodel": Framework("primus/configs/modules/nemo_automodel",
                                REPO / "primus" / "configs" / "modules" / "nemo_automodel" / "amd", ("pre_trainer.yaml",),
                                render_automodel, models=("wan2_2_t2v_a14b.yaml",)),
}
MODEL_OUT = REPO / "primus" / "configs" / "models"


def generate(framework: str = "megatron", git_dir: str = DEFAULT_GIT_DIR, commit: str = SOURCE_COMMIT
             ) -> dict[str, str]:
    """{file name under the framework's amd/ folder (a model preset: ``models/<name>``): its text}."""
    full = subprocess.run(["git", "--git-dir", git_dir, "rev-parse", commit], capture_output=True, text=True)
    if full.returncode != 0:
        raise SystemExit(f"gen_module_presets: no commit {commit} in {git_dir}")
    commit = full.stdout.strip()
    spec = FRAMEWORKS[framework]
    files = {}
    for name in spec.names:
        amd, chain = resolve(git_dir, commit, f"{spec.source_dir}/{name}", spec.source_dir)
        files[name] = spec.render(name, amd, chain, commit)
    models = f"primus/configs/models/{framework}"
    for name in spec.models:
        amd, chain = resolve(git_dir, commit, f"{models}/{name}", models)
        files[f"models/{name}"] = spec.render(name, amd, chain, commit, models)
    return files


def output_path(framework: str, name: str, out: Path | None) -> Path:
    """Where a generated file goes: ``out`` (tests), else the framework's amd/ folder (modules/ or models/)."""
    if out is not None:
        return out / name
    if name.startswith("models/"):
        return MODEL_OUT / framework / "amd" / name.split("/", 1)[1]
    return FRAMEWORKS[framework].out_dir / name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git-dir", default=DEFAULT_GIT_DIR, help="AMD Primus git directory (a bare mirror is fine)")
    parser.add_argument("--commit", default=SOURCE_COMMIT)
    parser.add_argument("--framework", choices=list(FRAMEWORKS), action="append",
                        help="this framework's presets only (repeatable; default: every framework)")
    parser.add_argument("--out", type=Path, help="the output folder (one --framework only; default: its amd/ folder)")
    parser.add_argument("--check", action="store_true", help="compare with the output; exit 1 on a difference")
    args = parser.parse_args(argv)
    frameworks = args.framework or list(FRAMEWORKS)
    if args.out is not None and len(frameworks) != 1:
        parser.error("--out needs exactly one --framework")
    stale = []
    for framework in frameworks:
        for name, text in generate(framework, args.git_dir, args.commit).items():
            path = output_path(framework, name, args.out)
            if args.check:
                current = path.read_text() if path.exists() else ""
                if current != text:
                    stale.append(f"{framework}/{name}")
                    sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True),
                                                               str(path), name))
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    if stale:
        print(f"gen_module_presets: {len(stale)} preset(s) differ from a fresh generation: {', '.join(stale)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
