"""Before a run's log files exist (the launcher validating, importing the engine), keep the
engines' warnings (their loggers' and Python's) for the files instead of printing them.

A module of its own, with nothing but ``logging``: the ``primus`` CLI imports it at start.
"""
from __future__ import annotations

import logging
import os
import sys


class _HeldRecords(logging.Handler):
    """Before a run's log files exist (the launcher validating, importing the engine): keep the
    engines' warnings (their own and Python's) for the files instead of printing them."""

    LIMIT = 1000

    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.records) < self.LIMIT:
            self.records.append(record)


QUIET_ENV = ("HF_DATASETS_DISABLE_PROGRESS_BARS", "HF_HUB_DISABLE_PROGRESS_BARS")
SET_HERE: set[str] = set()  # what this process set for itself: not the user's, not passed on to containers


def hold_records_until_logs_exist(verbose: bool = False) -> None:
    """For the ``primus`` CLI: nothing reaches the terminal from the root logger or ``warnings``
    until ``setup_logging`` installs the run's files, which then receive what was held; and,
    unless ``verbose``, Hugging Face's progress bars are off (building demo assets draws some)."""
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(_HeldRecords())
    logging.captureWarnings(True)
    if not verbose:
        quiet_progress_bars()


def quiet_progress_bars() -> None:
    """Hugging Face datasets/hub/transformers draw tqdm bars on stderr ("Generating train split",
    "Loading weights"); their documented switches turn them off, for libraries imported later
    (environment) and earlier (API)."""
    for name in QUIET_ENV:
        if name not in os.environ:
            os.environ[name] = "1"
            SET_HERE.add(name)
    if "datasets" in sys.modules:
        from datasets.utils import disable_progress_bars

        disable_progress_bars()
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars as hub_disable

        hub_disable()
    if "transformers" in sys.modules:
        from transformers.utils.logging import disable_progress_bar

        disable_progress_bar()
