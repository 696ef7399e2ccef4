import logging
import re
import warnings

import pytest

from primus.logs.setup import engine_warning_summary, setup_logging


def test_level_files_console_filter_and_format(tmp_path, capsys):
    logger = setup_logging(tmp_path, "pre_trainer", rank=1, world_size=2, console_ranks=[0],
                           secrets=["hunter2-token"], verbose=False)
    try:
        logger.debug("dbg")
        logger.info("banner")
        logging.getLogger("torchtitan.thing").info("engine info")
        logging.getLogger().warning("engine warning with hunter2-token")
        warnings.warn("a python warning")
        logger.error("broken")
    finally:
        for handler in logging.getLogger().handlers:
            handler.flush()
    rank_dir = tmp_path / "pre_trainer" / "rank-1"
    debug, info, warning, error = ((rank_dir / f"{n}.log").read_text() for n in ("debug", "info", "warning", "error"))
    assert "dbg" in debug and "dbg" not in info
    assert "engine info" in info and "banner" in info and "engine info" not in warning
    assert "a python warning" in warning and "broken" in warning
    assert "broken" in error and "engine warning" not in error
    assert "hunter2-token" not in debug and "<redacted>" in debug
    line = next(l for l in info.splitlines() if "banner" in l)
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d \[rank 1/2\] \[pre_trainer\] INFO ", line)
    out = capsys.readouterr().out
    assert "banner" not in out  # rank 1 is not a console rank: no INFO
    assert "broken" in out  # Primus' WARNING+ from every rank
    assert "engine warning" not in out and "a python warning" not in out  # engines' warnings: files only
    assert engine_warning_summary() == f"2 engine warnings → {rank_dir / 'warning.log'} (--verbose shows them)"


def test_engine_warnings_and_errors_on_the_console(tmp_path, capsys):
    setup_logging(tmp_path, "pre_trainer", rank=0, world_size=1, verbose=False)
    logging.getLogger("megatron.core").warning("engine chatter")
    logging.getLogger("megatron.core").error("engine failure")  # errors always show: the cause of a crash
    logging.getLogger("primus.pre_trainer").warning("primus says")
    out = capsys.readouterr().out
    assert "engine failure" in out and "primus says" in out and "engine chatter" not in out
    assert engine_warning_summary().startswith("1 engine warning → ")

    setup_logging(tmp_path, "pre_trainer", rank=0, world_size=1, verbose=True)  # primus train --verbose
    logging.getLogger("megatron.core").warning("engine chatter")
    logging.getLogger("py.warnings").warning("UserWarning: shown too")  # what captureWarnings emits
    out = capsys.readouterr().out
    assert "engine chatter" in out and "shown too" in out
    assert engine_warning_summary() is None  # nothing hidden, nothing to point at


def test_verbose_comes_from_the_environment(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PRIMUS_VERBOSE", "1")
    setup_logging(tmp_path, "pre_trainer", rank=0, world_size=1)
    logging.getLogger("torchtitan").warning("visible")
    assert "visible" in capsys.readouterr().out


def test_what_engines_said_before_the_logs_existed_lands_in_the_files(tmp_path, capsys):
    from primus.logs.held import hold_records_until_logs_exist

    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    hold_records_until_logs_exist()  # what `primus` does at start, before the launcher validates
    logging.getLogger("megatron.core.optimizer").warning("Apex is not installed")
    assert capsys.readouterr().err == ""  # not on the terminal
    setup_logging(tmp_path, "pre_trainer", rank=0, world_size=1, verbose=False)
    warning_log = (tmp_path / "pre_trainer" / "rank-0" / "warning.log").read_text()
    assert "WARNING megatron.core.optimizer: Apex is not installed" in warning_log
    assert "Apex" not in capsys.readouterr().out and engine_warning_summary().startswith("1 engine warning")


def test_an_engines_prints_and_progress_bars_go_to_debug_log(tmp_path, capsys):
    from tqdm import tqdm

    from primus.logs.setup import engine_output_to_log

    setup_logging(tmp_path, "pre_trainer", rank=0, world_size=1, verbose=False)
    with engine_output_to_log(verbose=False):
        print("> initializing torch distributed with 1 workers.")
        for _ in tqdm(range(3), desc="Epoch 1/2", mininterval=0):
            pass
        logging.getLogger("primus.metrics").info("[TRAIN] step=1")  # Primus' own line still shows
    out = capsys.readouterr()
    assert "initializing" not in out.out + out.err and "Epoch 1/2" not in out.out + out.err
    assert "[TRAIN] step=1" in out.out
    debug = (tmp_path / "pre_trainer" / "rank-0" / "debug.log").read_text()
    assert "DEBUG engine.output: > initializing torch distributed with 1 workers." in debug
    assert "Epoch 1/2: 100%" in debug
    with engine_output_to_log(verbose=True):  # --verbose: untouched
        print("shown as is")
    assert "shown as is" in capsys.readouterr().out


def test_library_loggers_with_their_own_stderr_handler_reach_primus_files(tmp_path, capsys):
    pytest.importorskip("diffusers")
    pytest.importorskip("datasets")
    import datasets  # noqa: F401  (each adds a StreamHandler(stderr) to its root logger)
    import diffusers  # noqa: F401
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.get_logger("diffusers.models")  # upstream: its own stderr handler, no propagation
    setup_logging(tmp_path, "pre_trainer", rank=0, world_size=1, verbose=False)
    diffusers_logging.get_logger("diffusers.models").warning("kept in float32")
    logging.getLogger("datasets.builder").warning("a datasets warning")
    out = capsys.readouterr()
    assert "kept in float32" not in out.err + out.out and "a datasets warning" not in out.err + out.out
    warning_log = (tmp_path / "pre_trainer" / "rank-0" / "warning.log").read_text()
    assert "diffusers.models: kept in float32" in warning_log and "datasets.builder: a datasets warning" in warning_log
