"""Ranges of TorchTitan's numeric settings, checked on the final values before any run starts.

TorchTitan's config dataclasses carry types but no ranges: ``training.steps: 0`` trains nothing and
then counts as a completed run, ``local_batch_size: 0`` dies in an ``assert`` on every rank,
``tensor_parallel_degree: 0`` passes until the device mesh is built. Each entry says what the
engine needs; the special values are the ones TorchTitan documents (``-1``: fill / derive).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from primus.config.errors import ConfigError


@dataclass(frozen=True)
class Range:
    ge: float | None = None
    le: float | None = None
    gt: float | None = None
    special: dict[Any, str] = dataclasses.field(default_factory=dict)  # value -> what it means

    def violation(self, value: Any) -> str | None:
        if value is None or value in self.special and not isinstance(value, bool):
            return None
        bounds = [f"> {self.gt:g}" if self.gt is not None else "", f">= {self.ge:g}" if self.ge is not None else "",
                  f"<= {self.le:g}" if self.le is not None else ""]
        wanted = " and ".join(b for b in bounds if b)
        if self.special:
            wanted = " or ".join([*(f"{v} ({why})" for v, why in self.special.items()), wanted])
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{value!r} is not a number; expected {wanted}"
        low_ok = (self.gt is None or value > self.gt) and (self.ge is None or value >= self.ge)
        if not (math.isfinite(value) and low_ok and (self.le is None or value <= self.le)):
            return f"{value!r} is out of range; expected {wanted}"
        return None


POSITIVE = Range(ge=1)
NON_NEGATIVE = Range(ge=0)
FRACTION = Range(ge=0, le=1)

RANGES: dict[str, Range] = {
    "training.steps": POSITIVE,
    "training.local_batch_size": POSITIVE,
    "training.global_batch_size": Range(ge=1, special={-1: "local_batch_size x data-parallel degree"}),
    "training.seq_len": POSITIVE,
    "training.max_norm": Range(ge=0),  # 0: every gradient clipped to zero (a frozen-weights check)
    "training.gc_freq": POSITIVE,
    "parallelism.data_parallel_replicate_degree": POSITIVE,
    "parallelism.data_parallel_shard_degree": Range(ge=1, special={-1: "fill the world"}),
    "parallelism.tensor_parallel_degree": POSITIVE,
    "parallelism.pipeline_parallel_degree": POSITIVE,
    "parallelism.context_parallel_degree": POSITIVE,
    "parallelism.expert_parallel_degree": POSITIVE,
    "parallelism.pipeline_parallel_microbatch_size": POSITIVE,
    "parallelism.pipeline_parallel_layers_per_stage": POSITIVE,
    "parallelism.pipeline_parallel_first_stage_less_layers": NON_NEGATIVE,
    "parallelism.pipeline_parallel_last_stage_less_layers": NON_NEGATIVE,
    "lr_scheduler.warmup_steps": NON_NEGATIVE,
    "lr_scheduler.total_steps": POSITIVE,
    "lr_scheduler.decay_ratio": FRACTION,
    "lr_scheduler.min_lr_factor": FRACTION,
    "checkpoint.interval": POSITIVE,
    "checkpoint.keep_latest_k": NON_NEGATIVE,
    "checkpoint.load_step": Range(ge=0, special={-1: "the latest"}),
    "metrics.log_freq": POSITIVE,
    "dataloader.num_workers": NON_NEGATIVE,
    "dataloader.prefetch_factor": POSITIVE,
    "comm.init_timeout_seconds": POSITIVE,
    "comm.train_timeout_seconds": POSITIVE,
    "validator.freq": POSITIVE,
    "validator.steps": Range(ge=1, special={-1: "the whole validation set"}),
    "profiler.profile_freq": POSITIVE,
    "profiler.profiler_repeat": POSITIVE,
    "profiler.profiler_skip_first": NON_NEGATIVE,
    "profiler.profiler_skip_first_wait": NON_NEGATIVE,
    "profiler.profiler_active": POSITIVE,
    "profiler.profiler_warmup": NON_NEGATIVE,
    "profiler.memory_snapshot_freq": POSITIVE,
    "profiler.memory_snapshot_max_entries": POSITIVE,
    "comm.trace_buf_size": NON_NEGATIVE,
    "validator.dataloader.num_workers": NON_NEGATIVE,
    "validator.dataloader.prefetch_factor": POSITIVE,
}
# Numeric settings any value of their type is fine for (a test checks every numeric field is in one table).
UNBOUNDED: dict[str, str] = {"debug.seed": "any integer: torch takes seeds modulo 2**64"}
# Each optimizer param group's keyword arguments (``optimizer.param_groups[i].optimizer_kwargs``).
OPTIMIZER_RANGES: dict[str, Range] = {"lr": Range(gt=0), "eps": Range(gt=0), "weight_decay": NON_NEGATIVE}


def _value(cfg: Any, dotted: str) -> tuple[bool, Any]:
    obj = cfg
    for part in dotted.split("."):
        if not hasattr(obj, part):
            return False, None
        obj = getattr(obj, part)
    return True, obj


def check_ranges(cfg: Any, fail: Callable[[str, str], ConfigError]) -> None:
    """Raise ``fail(key, message)`` for the first setting of ``cfg`` outside its range."""
    for key, allowed in RANGES.items():
        present, value = _value(cfg, key)
        problem = allowed.violation(value) if present else None
        if problem:
            raise fail(key, problem)
    for index, group in enumerate(getattr(cfg.optimizer, "param_groups", None) or []):
        for name, allowed in OPTIMIZER_RANGES.items():
            problem = allowed.violation((group.optimizer_kwargs or {}).get(name))
            if problem:
                raise fail(f"optimizer.param_groups[{index}].optimizer_kwargs.{name}", problem)


def non_finite_numbers(tree: Any, path: str = "") -> Iterator[str]:
    """Dotted keys of NaN/infinite floats in a YAML-shaped tree: never a meaningful setting."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from non_finite_numbers(value, f"{path}.{key}" if path else str(key))
    elif isinstance(tree, (list, tuple)):
        for index, value in enumerate(tree):
            yield from non_finite_numbers(value, f"{path}[{index}]")
    elif isinstance(tree, float) and not math.isfinite(tree):
        yield path
