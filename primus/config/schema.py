"""The Primus-level experiment schema (pydantic), and pydantic errors as one-line messages."""
from __future__ import annotations

from typing import Any, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from primus.config.errors import ConfigError, did_you_mean
from primus.config.provenance import Provenance

_PATH_SAFE = r"^[A-Za-z0-9_.@+\-]+$"


class LoggingSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    console_ranks: list[int] = Field(default_factory=lambda: [0], description="ranks that print INFO")
    level: str = Field("INFO", pattern=r"^(DEBUG|INFO|WARNING|ERROR)$", description="console level")


class ModuleSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    framework: str
    config: str | None = None  # module preset: configs/modules/<framework>/<config>
    model: str | None = None  # model preset: configs/models/<framework>/ then configs/models/common/
    stage: str = "pretrain"
    overrides: dict[str, Any] = Field(default_factory=dict)


class PrimusOptions(BaseModel):
    """The ``primus:`` block of a module's params: Primus' own knobs, never handed to an engine."""

    model_config = ConfigDict(extra="forbid")

    tiny_assets: str | None = Field(None, description="build the tiny tokenizer/corpus here and train on it")
    peak_tflops: float | None = Field(None, gt=0, description="device peak for MFU (overrides the table)")
    peak_dtype: str = Field("bf16", pattern=r"^(bf16|fp32)$", description="which peak of the table to use")
    tensorboard: bool = True
    hf_token: str | None = Field(None, description="exported as HF_TOKEN to the workers; never saved")


class ExperimentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    work_group: str = Field(pattern=_PATH_SAFE)
    user_name: str = Field(pattern=_PATH_SAFE)
    exp_name: str = Field(pattern=_PATH_SAFE)
    workspace: str
    logging: LoggingSpec = Field(default_factory=LoggingSpec)
    modules: dict[str, ModuleSpec] = Field(min_length=1)


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names allowed at ``loc`` (for did-you-mean), walking models and dict values."""
    current: Any = model
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            current = field.annotation if field else None
        elif get_origin(current) is dict:
            current = get_args(current)[1]
        else:
            return []
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def pydantic_error_to_config_error(
    exc: ValidationError, model: type[BaseModel], provenance: Provenance, prefix: str = ""
) -> ConfigError:
    """Every mistake pydantic found, one line each; an unknown key first (it usually explains a
    "missing" one: a typo)."""
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    meant = set()  # a key that is "missing" because of a typo is the same mistake: said once
    for error in errors:
        if error["type"] == "extra_forbidden":
            loc = tuple(error["loc"])
            hint = did_you_mean(str(loc[-1]), _fields_at(model, loc[:-1]))
            if hint:
                meant.add((*loc[:-1], hint.split("'")[1]))
    errors = [e for e in errors if not (e["type"] == "missing" and tuple(e["loc"]) in meant)]
    return ConfigError.of_all(_one_error(error, model, provenance, prefix) for error in errors)


def _one_error(error: dict[str, Any], model: type[BaseModel], provenance: Provenance, prefix: str) -> ConfigError:
    from primus.config.secrets import is_secret_key

    loc = tuple(error["loc"])
    dotted = ".".join(str(p) for p in loc)
    full = f"{prefix}.{dotted}" if prefix else dotted
    where = provenance.describe(full)
    if error["type"] == "extra_forbidden":
        hint = did_you_mean(str(loc[-1]), _fields_at(model, loc[:-1]))
        return ConfigError(f"{where}: unknown key '{full}'{hint}", key=full)
    if error["type"] == "missing":
        return ConfigError(f"{where}: missing required key '{full}'", key=full)
    value = "<redacted>" if any(is_secret_key(str(part)) for part in loc) else repr(error.get("input"))
    return ConfigError(f"{where}: {full}={value}: {error['msg']}", key=full)


def validate_model(model: type[BaseModel], data: dict[str, Any], provenance: Provenance, prefix: str = ""):
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise pydantic_error_to_config_error(exc, model, provenance, prefix) from None
