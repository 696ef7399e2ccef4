"""Structured per-rank logs: ``logs/{module}/rank-{r}/{debug,info,warning,error}.log``.

Each file holds its level and above from this rank; the engines' loggers and Python
warnings propagate to the root logger and land in the same files. The console shows
Primus' own lines: INFO from the chosen ranks (default rank 0), WARNING+ from every rank,
so an N-rank job never prints N copies of the same banner. Engine warnings (any logger
outside ``primus``, Python warnings) stay in the files and are counted: the run ends with
one line saying how many and where (``engine_warning_summary``). Engine errors still show.
Third-party progress bars (Hugging Face datasets/hub) are off. ``verbose`` (``primus train
--verbose``, ``PRIMUS_VERBOSE=1``) puts engine warnings and progress bars back on the console.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from primus.config.secrets import mask_text
from primus.logs.held import quiet_progress_bars

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


def _is_primus(record: logging.LogRecord) -> bool:
    return record.name == "primus" or record.name.startswith("primus.")


class _ConsoleFilter(logging.Filter):
    """Primus' INFO on console ranks and its warnings everywhere; engines' errors; engines'
    warnings only when ``verbose`` (otherwise counted, for the end-of-run line)."""

    def __init__(self, show_info: bool, verbose: bool):
        super().__init__()
        self.show_info, self.verbose = show_info, verbose
        self.engine_warnings = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if _is_primus(record):
            return record.levelno >= logging.WARNING or self.show_info
        if record.levelno >= logging.ERROR:
            return True
        if record.levelno >= logging.WARNING:
            self.engine_warnings += 1
            return self.verbose
        return False


_console_filter: _ConsoleFilter | None = None
_warning_log: Path | None = None


def verbose_from_env() -> bool:
    return os.environ.get("PRIMUS_VERBOSE", "") not in ("", "0", "false", "False")


def engine_warning_summary() -> str | None:
    """``N engine warnings → {warning.log}`` for this rank, or None when there were none or they
    were shown (verbose)."""
    if _console_filter is None or _console_filter.verbose or not _console_filter.engine_warnings:
        return None
    n = _console_filter.engine_warnings
    return f"{n} engine warning{'s' if n != 1 else ''} → {_display_path(_warning_log)} (--verbose shows them)"


def _display_path(path: Path | None) -> str:
    if path is None:
        return "warning.log"
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# Libraries that print through a stderr handler of their own on their root logger (not, or not
# only, through the root logger's): their records go to Primus' handlers instead.
_LIBRARIES_WITH_HANDLERS = ("transformers", "diffusers", "datasets")


def route_library_loggers() -> None:
    for name in _LIBRARIES_WITH_HANDLERS:
        if name not in sys.modules:
            continue  # its handler is made at import: inside engine_output_to_log it writes to debug.log
        library = logging.getLogger(name)
        for handler in list(library.handlers):
            if type(handler) is logging.StreamHandler:
                library.removeHandler(handler)
        library.propagate = True


class _LinesToLog(io.TextIOBase):
    """A text stream whose lines (``\\n`` or a progress bar's ``\\r``) become DEBUG records."""

    def __init__(self, logger: logging.Logger):
        self.logger, self.pending = logger, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = re.split(r"[\r\n]", self.pending)
        for line in lines:
            if line.strip():
                self.logger.debug(line.rstrip())
        return len(text)

    def flush(self) -> None:
        if self.pending.strip():
            self.logger.debug(self.pending.rstrip())
        self.pending = ""


@contextlib.contextmanager
def engine_output_to_log(verbose: bool | None = None) -> Iterator[None]:
    """While an engine runs: what it prints or draws on stdout/stderr itself (``print``, tqdm bars)
    goes to this rank's debug.log (logger ``engine.output``), not the console. Primus' console
    handler keeps the real stdout; a crash's traceback is printed after this block."""
    verbose = verbose_from_env() if verbose is None else verbose
    route_library_loggers()
    if verbose:
        yield
        return
    stream = _LinesToLog(logging.getLogger("engine.output"))
    with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
        try:
            yield
        finally:
            stream.flush()
            route_library_loggers()


def setup_logging(log_root: Path, module: str, rank: int, world_size: int, *,
                  console_ranks: list[int] | None = None, console_level: str = "INFO",
                  secrets: list[str] | None = None, verbose: bool | None = None) -> logging.Logger:
    """Install file and console handlers on the root logger; return the module's logger.
    ``verbose`` None: from ``$PRIMUS_VERBOSE``."""
    global _console_filter, _warning_log
    verbose = verbose_from_env() if verbose is None else verbose
    rank_dir = log_root / module / f"rank-{rank}"
    rank_dir.mkdir(parents=True, exist_ok=True)
    formatter = PrimusFormatter(rank, world_size, module, secrets)
    root = logging.getLogger()
    held: list[logging.LogRecord] = []
    for handler in list(root.handlers):
        held += getattr(handler, "records", [])
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
    _console_filter = _ConsoleFilter(rank in (console_ranks if console_ranks is not None else [0]), verbose)
    _warning_log = rank_dir / "warning.log"
    console.addFilter(_console_filter)
    console.setFormatter(formatter)
    root.addHandler(console)
    logging.captureWarnings(False)  # re-take warnings.showwarning even if an earlier capture is stale
    logging.captureWarnings(True)
    route_library_loggers()
    if not verbose:
        quiet_progress_bars()
    for record in held:  # what the engines said while the launcher validated, in this rank's files
        record.__dict__.pop("_primus_text", None)
        root.handle(record)
    return logging.getLogger(f"primus.{module}")

