"""How the ``primus`` command ends when something goes wrong: always one line, never a traceback.

- A mistake in the user's input (a file, a value, a path, an environment variable, a command-line
  flag) is a ``ConfigError``: one ``primus: error: …`` line naming the file:line, key, path or
  variable, exit 2. argparse's own complaints (``--step abc``, a missing ``--to``) are the same:
  one line instead of its usage block.
- Anything else is a bug in Primus or an engine: one line naming the exception and a debug log
  holding the whole traceback (``--verbose`` prints it as well), exit 1.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
import tempfile
import traceback
from pathlib import Path

from primus.config.errors import ConfigError, mask_secrets

INTERNAL_ERROR_EXIT = 1


class UsageError(ConfigError):
    """argparse found the command line malformed (unknown flag, missing or ill-typed value)."""


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are a ``UsageError``, not a usage block and ``sys.exit(2)``.

    Subcommand parsers inherit the class (``add_subparsers`` builds them with ``type(self)``)."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        command = self.prog.removeprefix("primus").strip()
        raise UsageError(f"{command + ': ' if command else ''}{message} (see {self.prog} --help)")


def debug_log_dir(env=os.environ) -> Path:
    """Where internal errors leave their traceback: ``$PRIMUS_DEBUG_DIR``, else the user's cache."""
    if env.get("PRIMUS_DEBUG_DIR"):
        return Path(env["PRIMUS_DEBUG_DIR"]).expanduser()
    cache = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "primus" / "debug"


def _write_debug_log(text: str) -> Path | None:
    """The traceback in a private file (0600); None when no place can be written."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    for folder in (debug_log_dir(), Path(tempfile.gettempdir()) / f"primus-debug-{os.getuid()}"):
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            path = folder / f"error-{stamp}-{os.getpid()}.log"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
            return path
        except OSError:
            continue
    return None


def report_internal_error(exc: BaseException, argv: list[str], *, verbose: bool) -> int:
    """One line for an unexpected exception (the traceback in a debug log; on the console with
    ``--verbose``); returns the exit status."""
    text = mask_secrets("".join(traceback.format_exception(exc)))
    command = " ".join(mask_secrets(a) for a in ["primus", *argv])
    log = _write_debug_log(f"{command}\n\n{text}")
    if verbose:
        print(text, end="", file=sys.stderr)
    summary = mask_secrets(" ".join(f"{type(exc).__name__}: {exc}".split()))[:300]
    where = f"the traceback is in {log}" if log else "no debug log could be written"
    print(f"primus: internal error (not a mistake in your input; please report it): {summary} "
          f"[{where}{'' if verbose else '; --verbose prints it'}]", file=sys.stderr)
    return INTERNAL_ERROR_EXIT


def report_user_error(exc: ConfigError) -> int:
    for line in exc.lines():
        print(f"primus: error: {line}", file=sys.stderr)
    return exc.exit_code
