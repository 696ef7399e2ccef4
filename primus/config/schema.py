"""The Primus-level experiment schema (pydantic), and pydantic errors as one-line messages.

Every numeric key has a range, and names that become directories cannot leave the workspace.
An error never echoes a secret's value, and echoes at most a short prefix of any other.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from primus.config.errors import ConfigError, did_you_mean
from primus.config.provenance import Provenance
from primus.config.secrets import REDACTED, is_secret_key

# one directory level of letters, digits and _.@+-, not starting with "." (so never "." or "..",
# which would put the run outside the workspace)
_PATH_SAFE = r"^[A-Za-z0-9_@+\-][A-Za-z0-9_.@+\-]{0,127}$"
MAX_RANKS = 1 << 20  # far above any job; bounds rank lists
MAX_PEAK_TFLOPS = 1e6  # 1 EFLOP/s per device: a typo beyond it, not a device
_ECHO_CHARS = 80


class WandbSpec(BaseModel):
    """``logging.wandb``: Weights & Biases for any backend (Megatron-LM's ``wandb_*`` keys map here)."""

    model_config = ConfigDict(extra="forbid")

    project: str | None = None  # set (here or as wandb_project) to turn W&B on
    entity: str | None = None
    name: str | None = None  # default: exp_name
    dir: str | None = None  # default: {run_dir}/wandb
    mode: Literal["online", "offline", "disabled"] | None = None  # default: wandb's own ($WANDB_MODE)
    tags: list[str] = Field(default_factory=list)


class MlflowSpec(BaseModel):
    """``logging.mlflow``: MLflow for any backend (AMD Primus' ``mlflow_*`` keys map here)."""

    model_config = ConfigDict(extra="forbid")

    tracking_uri: str | None = None  # default: $MLFLOW_TRACKING_URI, else a file store in {run_dir}/mlruns
    experiment_name: str | None = None  # default: work_group/user_name
    run_name: str | None = None  # default: exp_name


class LoggingSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    console_ranks: list[Annotated[int, Field(ge=0, lt=MAX_RANKS)]] = Field(
        default_factory=lambda: [0], max_length=4096, description="ranks that print INFO")
    level: str = Field("INFO", pattern=r"^(DEBUG|INFO|WARNING|ERROR)$", description="console level")
    wandb: WandbSpec | None = None
    mlflow: MlflowSpec | None = None


class ModuleSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    framework: str
    config: str | None = None  # module preset: configs/modules/<framework>/<config>
    model: str | None = None  # model preset: configs/models/<framework>/ then configs/models/common/
    stage: str = "pretrain"
    overrides: dict[str, Any] = Field(default_factory=dict)


class CheckpointOptions(BaseModel):
    """``primus.checkpoint``: what a failed save does (every backend that saves through Primus's hooks)."""

    model_config = ConfigDict(extra="forbid")

    fail_on_error: bool = Field(False, description="a save that fails (disk full, permission) stops the run; "
                                                   "default: a WARNING, the previous checkpoint kept, training goes on")


class StragglerOptions(BaseModel):
    """``primus.stragglers``: the per-rank straggler report (``primus.runtime.stragglers``)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    interval: int = Field(100, ge=1, le=1_000_000, description="compare the ranks every N steps")
    threshold: float = Field(0.2, gt=0, le=10, allow_inf_nan=False,
                             description="name a rank this much slower than the median of the others (0.2 = 20%)")


class HangOptions(BaseModel):
    """``primus.hang``: the per-rank watchdog (``primus.runtime.watchdog``)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    deadline_s: float | None = Field(None, gt=0, le=7 * 86400, allow_inf_nan=False,
                                     description="no step for this long is a hang (None: factor x median step)")
    factor: float = Field(5.0, ge=1, le=1000, allow_inf_nan=False, description="deadline = factor x median step")
    floor_s: float = Field(60.0, gt=0, le=7 * 86400, allow_inf_nan=False, description="the deadline's minimum")
    action: Literal["exit", "wait"] = Field("exit", description="after the dumps: exit non-zero, or keep waiting")
    flight_recorder_entries: int = Field(2000, ge=0, le=1_000_000,
                                         description="collectives torch's flight recorder keeps per rank (0: off)")


class HubOptions(BaseModel):
    """Seconds a Hugging Face Hub request may take when a run fetches a Hub id (primus/compat/hub.py)."""

    model_config = ConfigDict(extra="forbid")

    connect_timeout_s: float = Field(10.0, gt=0, le=3600, allow_inf_nan=False)
    read_timeout_s: float = Field(30.0, gt=0, le=3600, allow_inf_nan=False, description="between two reads")
    stall_timeout_s: float = Field(90.0, gt=0, le=24 * 3600, allow_inf_nan=False,
                                   description="without any answer, across retries: then the run stops")


class PrimusOptions(BaseModel):
    """The ``primus:`` block of a module's params: Primus' own knobs, never handed to an engine."""

    model_config = ConfigDict(extra="forbid")

    tiny_assets: str | None = Field(None, description="build the tiny tokenizer/corpus here and train on it")
    peak_tflops: float | None = Field(None, gt=0, le=MAX_PEAK_TFLOPS, allow_inf_nan=False,
                                      description="device peak for MFU (overrides the table)")
    peak_dtype: str = Field("bf16", pattern=r"^(bf16|fp32)$", description="which peak of the table to use")
    tensorboard: bool = True
    hf_token: str | None = Field(None, description="exported as HF_TOKEN to the workers; never saved")
    # Settings AMD Primus experiments reach through their own key names (primus/compat):
    avg_skip_steps: int = Field(0, ge=0, description="[TRAIN] averages leave out the first N steps")
    avg_window: int | None = Field(None, gt=0, description="[TRAIN] averages over the last N steps (None: off)")
    wandb: bool | None = Field(None, description="W&B on/off; None: on when a project is named (logging.wandb, "
                                                 "wandb_project)")
    mlflow: bool | None = Field(None, description="MLflow on/off; None: on when logging.mlflow or a run/experiment "
                                                  "name is given")
    mlflow_run_name: str | None = None
    mlflow_experiment_name: str | None = None
    save_last_checkpoint: bool = Field(True, description="save a checkpoint at the last step (Megatron)")
    sanitize_nan_grads: bool = Field(False, description="NaN/Inf gradient elements become 0 before the gradient "
                                                        "check and reduction, said once per step (Megatron DDP; "
                                                        "benchmarks only: it hides numerical bugs)")
    checkpoint: CheckpointOptions = Field(default_factory=CheckpointOptions)
    resume: Literal["auto", "always", "never"] | None = Field(
        None, description="resume policy when the command line names none (--resume / --no-resume)")
    sample_hashes: bool = Field(False, description="a sample_hash in each step row of the run's metrics: a digest of the "
                                                   "step's global batch (primus.runtime.sample_hash)")
    stragglers: StragglerOptions = Field(default_factory=StragglerOptions)
    hang: HangOptions = Field(default_factory=HangOptions)
    hub: HubOptions = Field(default_factory=HubOptions, description="Hugging Face Hub timeouts")


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
    """Every mistake pydantic found, one line each; an unknown key first. A "missing" key that an
    unknown one's did-you-mean names is the same typo, reported once."""
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
    loc = tuple(error["loc"])
    dotted = ".".join(str(p) for p in loc)
    full = f"{prefix}.{dotted}" if prefix else dotted
    where = provenance.describe(full)
    if error["type"] == "extra_forbidden":
        hint = did_you_mean(str(loc[-1]), _fields_at(model, loc[:-1]))
        return ConfigError(f"{where}: unknown key '{full}'{hint}", key=full)
    if error["type"] == "missing":
        return ConfigError(f"{where}: missing required key '{full}'", key=full)
    if error["type"] == "string_pattern_mismatch" and loc[-1] in ("work_group", "user_name", "exp_name"):
        msg = "must be one directory name of letters, digits and _.@+-, not starting with '.', at most 128 characters"
    else:
        msg = error["msg"]
    return ConfigError(f"{where}: {full}={_echo(full, error.get('input'))}: {msg}", key=full)


def _echo(dotted: str, value: Any) -> str:
    """The offending value as the error shows it: never a secret, never a wall of text."""
    if any(is_secret_key(part) for part in dotted.split(".")):
        return REDACTED
    text = repr(value)
    return text if len(text) <= _ECHO_CHARS else f"{text[:_ECHO_CHARS]}... ({len(text)} characters)"


def validate_model(model: type[BaseModel], data: dict[str, Any], provenance: Provenance, prefix: str = ""):
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise pydantic_error_to_config_error(exc, model, provenance, prefix) from None
