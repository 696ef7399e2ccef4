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

from primus.compat import common
from primus.compat.dialect import amd_marker, amd_shape, unread_lines, unread_top_level
from primus.compat.families import framework_reason, model_reason
from primus.compat.rules import Translation
from primus.compat.tables import TABLES
from primus.compat.translate import CompatContext, apply_rules
from primus.config.errors import ConfigError
from primus.config.provenance import Provenance

__all__ = ["AMD_PRIMUS", "TABLES", "Translation", "translate_module"]


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


class AmdPrimus:
    """AMD Primus's dialect, for ``primus.config.resolve.resolve_experiment(..., dialect=AMD_PRIMUS)``."""

    def refuse(self, experiment: dict[str, Any], provenance: Provenance) -> None:
        """AMD Primus's trainers and model families Primus does not run (MaxText, Megatron-Bridge, Flux, ...):
        one line with the reason, before the schema trips over the other keys their files carry."""
        modules = experiment.get("modules")
        for name, module in (modules.items() if isinstance(modules, dict) else ()):
            if not isinstance(module, dict):
                continue
            framework, model = str(module.get("framework")), module.get("model")
            reason = framework_reason(framework)
            key = f"modules.{name}.framework"
            if reason is None and isinstance(model, str):
                reason, key = model_reason(framework, model), f"modules.{name}.model"
            if reason is not None:
                what = f"framework '{framework}'" if key.endswith("framework") else f"model preset '{model}'"
                raise ConfigError(f"{provenance.describe(key)}: {what}: {reason}")
            if "trainer_class" in module:
                key = f"modules.{name}.trainer_class"
                raise ConfigError(f"{provenance.describe(key)}: {key}: AMD Primus's trainer class "
                                  f"'{module['trainer_class']}' is not a Primus trainer: the framework's own trainer "
                                  f"runs (remove trainer_class)")

    presets = "amd"  # AMD Primus's module presets: primus/configs/modules/<framework>/amd/

    def unknown_model(self, framework: str, model: str) -> str | None:
        return model_reason(framework, model)

    def owns(self, framework: str, overrides: dict[str, Any] | None, *, model: str | None = None,
             stage_explicit: bool = True) -> bool:
        """An AMD Primus-only key among the module's overrides (``dialect.amd_marker``), or AMD Primus's module
        shape (``dialect.amd_shape``: no ``stage:``, a model preset AMD Primus ships)."""
        return (amd_marker(framework, overrides) is not None
                or amd_shape(framework, model, stage_explicit) is not None)

    def unread_top_level(self, experiment: dict[str, Any], known: set[str]) -> dict[str, Any]:
        return unread_top_level(experiment, known)

    def unread_lines(self, unread: dict[str, Any], where: dict[str, str], module: str,
                     params: dict[str, Any]) -> list[Translation]:
        return unread_lines(unread, where, module, params)

    def translate(self, name: str, framework: str, params: dict[str, Any], *, stage: str, stage_explicit: bool,
                  experiment: dict[str, Any], provenance: Provenance, own_format: bool = False
                  ) -> tuple[str, list[Translation]]:
        return translate_module(name, framework, params, stage=stage, stage_explicit=stage_explicit,
                                experiment=experiment, provenance=provenance, amd_format=own_format)


AMD_PRIMUS = AmdPrimus()
