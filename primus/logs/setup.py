"""Structured per-rank logs: ``logs/{module}/rank-{r}/{debug,info,warning,error}.log``.

Each file holds its level and above from this rank; the engines' loggers and Python
warnings propagate to the root logger and land in the same files. The console shows
Primus INFO from the chosen ranks (default rank 0) and WARNING+ from every rank, so an
N-rank job never prints N copies of the same banner.
"""
from __future__ import annotations

import logging
import sys
from datetime import datetime
from pathlib import Path

from primus.config.secrets import mask_text

LEVEL_FILES = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class PrimusFormatter(logging.Formatter):
    """``2026-11-30T11:40:00.123+00:00 [rank 0/2] [pre_trainer] INFO name: message``."""

    def __init__(self, rank: int, world_size: int, module: str, secrets: list[str] | None = None):
        super().__init__()
        self.prefix = f"[rank {rank}/{world_size}] [{module}]"
        self.secrets = secrets or []

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return datetime.fromtimestamp(record.created).astimezone().isoformat(timespec="milliseconds")

    def format(self, record: logging.LogRecord) -> str:
        # every handler of the root logger (level files, console) shares this formatter: format once
        cached = record.__dict__.get("_primus_text")
        if cached is not None and cached[0] is self:
            return cached[1]
        text = f"{self.formatTime(record)} {self.prefix} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        text = mask_text(text, self.secrets) if self.secrets else text
        record._primus_text = (self, text)
        return text


class _LogFile(logging.FileHandler):
    """A log file that says once, in one line, when it cannot be written (disk full)."""

    reported = False

    def handleError(self, record: logging.LogRecord) -> None:
        if not _LogFile.reported:
            _LogFile.reported = True
            error = sys.exc_info()[1]
            print(f"primus: cannot write log file {self.baseFilename}: {error}", file=sys.stderr)


class _ConsoleFilter(logging.Filter):
    """INFO for Primus' own loggers on console ranks; engines' INFO stays in the files."""

    def __init__(self, show_info: bool):
        super().__init__()
        self.show_info = show_info

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        return self.show_info and record.name.startswith("primus")


def setup_logging(log_root: Path, module: str, rank: int, world_size: int, *,
                  console_ranks: list[int] | None = None, console_level: str = "INFO",
                  secrets: list[str] | None = None) -> logging.Logger:
    """Install file and console handlers on the root logger; return the module's logger."""
    rank_dir = log_root / module / f"rank-{rank}"
    rank_dir.mkdir(parents=True, exist_ok=True)
    formatter = PrimusFormatter(rank, world_size, module, secrets)
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    root.setLevel(logging.DEBUG)
    for name, level in LEVEL_FILES.items():
        handler = _LogFile(rank_dir / f"{name}.log", encoding="utf-8")
        handler.setLevel(level)
        handler.setFormatter(formatter)
        root.addHandler(handler)
    console = logging.StreamHandler(sys.stdout)
    console.setLevel(getattr(logging, console_level))
    console.addFilter(_ConsoleFilter(rank in (console_ranks if console_ranks is not None else [0])))
    console.setFormatter(formatter)
    root.addHandler(console)
    logging.captureWarnings(True)
    return logging.getLogger(f"primus.{module}")

