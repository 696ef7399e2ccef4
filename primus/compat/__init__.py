"""AMD Primus compatibility: their experiment files run here unchanged.

AMD Primus (github AMD-AGI/Primus) spells some settings its own way: AMD-only keys
(``stderr_sink_level``, ``disable_last_saving``, ``enable_primus_turbo``, ...), TorchTitan 0.2
names (``training.dataset``, ``optimizer.beta1``), tokenizer types (``Llama3Tokenizer``) and
AutoModel's retired ``optim:`` block. ``translate_module`` turns them into ours while the
experiment is resolved, before any engine validates it, one ``translated X → Y (why)`` line per
key. Each framework's rules are a data table (``megatron.py``, ``torchtitan.py``,
``nemo_automodel.py``, plus ``common.py`` for every module); ``rules.py`` says what a rule can do.
A key no table knows is left alone, so the engine's own validation refuses it by name.
"""
from __future__ import annotations

from typing import Any

from primus.compat import common, megatron, nemo_automodel, torchtitan
from primus.compat.rules import Rule, Translation
from primus.compat.translate import CompatContext, apply_rules
from primus.config.provenance import Provenance

TABLES: dict[str, dict[str, Rule]] = {
    "megatron": megatron.RULES,
    "torchtitan": torchtitan.RULES,
    "nemo_automodel": nemo_automodel.RULES,
}

__all__ = ["TABLES", "Translation", "translate_module"]


def translate_module(name: str, framework: str, params: dict[str, Any], *, stage: str, stage_explicit: bool,
                     experiment: dict[str, Any], provenance: Provenance,
                     amd_format: bool = False) -> tuple[str, list[Translation]]:
    """Rewrite ``params`` (and ``experiment``'s logging) in place; return the stage and the translations.
    ``amd_format``: the module is in AMD Primus's format (``dialect.amd_marker``): AMD's dropping rules apply."""
    ctx = CompatContext(name, framework, params, stage, stage_explicit, experiment, provenance,
                        amd_format=amd_format)
    apply_rules(ctx, common.RULES)
    apply_rules(ctx, TABLES.get(framework, {}))
    return ctx.stage, ctx.translations
