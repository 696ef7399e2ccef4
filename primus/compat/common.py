"""AMD Primus keys every framework's module accepts (their ``module_base.yaml``)."""
from __future__ import annotations

from typing import Any

from primus.compat.rules import custom, inert, table
from primus.compat.translate import ENVIRONMENT_NAME
from primus.config.errors import ConfigError

# AMD Primus logs through loguru; our console takes the stdlib levels.
LOGURU_LEVELS = {"TRACE": "DEBUG", "DEBUG": "DEBUG", "INFO": "INFO", "SUCCESS": "INFO", "WARNING": "WARNING",
                 "ERROR": "ERROR", "CRITICAL": "ERROR"}


def console_level(value: Any) -> str:
    level = LOGURU_LEVELS.get(str(value).upper())
    if level is None:
        raise ConfigError(f"log level {value!r} is not one of {', '.join(LOGURU_LEVELS)}")
    return level


def _sink_level(value: Any, ctx, key: str) -> None:
    """``sink_level`` (AMD: one level for every sink) sets the console; null leaves the others."""
    if value is None:
        ctx.note(key, value, "null: stderr_sink_level / file_sink_level decide")
        return
    ctx.set(key, _checked_level(ctx, key, value), "logging.level", "AMD Primus level of every log sink; files "
            "always hold each level in logs/<module>/rank-N/{debug,info,warning,error}.log", experiment=True)


def _stderr_level(value: Any, ctx, key: str) -> None:
    if ctx.amd.get("sink_level") is not None:  # AMD: sink_level wins over the per-sink levels
        ctx.note(key, value, "sink_level is set and wins")
        return
    ctx.set(key, _checked_level(ctx, key, value), "logging.level", "AMD Primus console (stderr) log level",
            experiment=True)


def _checked_level(ctx, key: str, value: Any) -> str:
    try:
        return console_level(value)
    except ConfigError as exc:
        raise ctx.fail(key, str(exc)) from None


MLPERF = ("AMD Primus's MLPerf trainer comes from the optional package primus_mllog (MLPerf compliance "
          "logging, a stop at the target evaluation loss), outside AMD Primus too; stage: pretrain runs the same "
          "training without them")


def _stage(value: Any, ctx, key: str) -> None:
    """A module preset may name its stage (AMD's ``sft_trainer.yaml`` says ``stage: sft``)."""
    if value == "mlperf_pretrain":  # validate / plan / dry-run the pretraining it is; a run is refused
        ctx.set_stage(key, value, "pretrain", "AMD Primus's MLPerf pretraining is a pretraining run")
        ctx.note(key, value, MLPERF, kind="refuse_at_run")
        return
    if ctx.stage_explicit and value != ctx.stage:
        raise ctx.fail(key, f"stage '{value}' contradicts the module's stage '{ctx.stage}' set in the "
                            f"experiment: keep one")
    ctx.set_stage(key, value, str(value), "a module preset names its stage")


RULES = table(
    custom("sink_level", "AMD Primus level for every log sink", _sink_level),
    custom("stderr_sink_level", "AMD Primus console log level", _stderr_level),
    inert("file_sink_level", "Primus writes every level to files: logs/<module>/rank-N/debug.log holds DEBUG and "
                             "above, info.log INFO and above, ..."),
    inert("trainable", "AMD Primus module flag; a Primus module always trains"),
    custom("stage", "the module's stage", _stage),
    inert(ENVIRONMENT_NAME, "an environment variable's name, not a training setting: export it in the shell, the "
                            "container or the Slurm script"),
)
