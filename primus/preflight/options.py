"""The options every rank's worker receives (a JSON-able dict built by the CLI)."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from primus.config.errors import ConfigError, did_you_mean
from primus.config.values import check_output_folder, parse_seconds
from primus.preflight.checks import ALL_CHECKS
from primus.preflight.perf import ALL_TESTS

CHECK_ALIASES = {"env": "environment", "gpu": "accelerators", "gpus": "accelerators", "accelerator": "accelerators",
                 "net": "network", "connect": "connectivity", "exp": "experiment"}
_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
          "g": 2**30, "gb": 2**30, "gib": 2**30}


def _names(value: str | list[str] | None, allowed: tuple[str, ...], what: str, aliases: dict[str, str]) -> list[str] | None:
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    result = []
    for item in (i.strip().lower() for i in items if i.strip()):
        name = aliases.get(item, item.replace("-", "").replace("_", ""))
        if name not in allowed:
            raise ConfigError(f"unknown {what} '{item}'{did_you_mean(item, allowed)}; known: {', '.join(allowed)}")
        if name not in result:
            result.append(name)
    return result


def parse_size(text: str | int) -> int:
    """``64K``, ``1M``, ``1GiB``, ``4096``: binary units."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise ConfigError(f"cannot read message size '{text}' (examples: 4096, 64K, 16M, 1G)")
    size = int(match.group(1)) * _UNITS[match.group(2).lower()]
    if size <= 0:
        raise ConfigError(f"message size must be positive, got '{text}'")
    return size


@dataclass(kw_only=True)
class PreflightOptions:
    report_dir: str = "preflight-report"
    quick: bool = False
    checks: list[str] | None = None  # None: all
    tests: list[str] | None = None  # None: all (the quick set is all tests at small sizes)
    sizes: list[int] | None = None  # collective message sizes in bytes; None: by device and --quick
    timeout: float = 60.0  # seconds for every rank to join, and for each later gather
    thresholds: str | None = None  # user YAML overriding thresholds.yaml
    experiment: dict[str, Any] | None = None  # {"model": ModelSpec dict, "layout": ParallelLayout dict}
    hosts: list[str] | None = None  # host of each node (by node rank), to name ranks that never join
    simulate_absent_ranks: list[int] = field(default_factory=list)  # test hook: these ranks never join
    workspace: str | None = None  # where the job writes, for the disk-space check; default the cwd

    def __post_init__(self) -> None:
        self.checks = _names(self.checks, ALL_CHECKS, "check", CHECK_ALIASES)
        self.tests = _names(self.tests, ALL_TESTS, "test", {})
        if self.sizes is not None:
            items = self.sizes.split(",") if isinstance(self.sizes, str) else self.sizes
            self.sizes = [parse_size(s) for s in items if str(s).strip()]
        self.timeout = parse_seconds(self.timeout, "--timeout")
        check_output_folder(self.report_dir, "--report-dir")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PreflightOptions":
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise ConfigError(f"unknown preflight option '{key}'{did_you_mean(key, known)}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def enabled_checks(self) -> list[str]:
        return list(self.checks) if self.checks is not None else list(ALL_CHECKS)

    @property
    def enabled_tests(self) -> list[str]:
        return list(self.tests) if self.tests is not None else list(ALL_TESTS)
