import logging
import re
import warnings

from primus.logs.setup import setup_logging


def test_level_files_console_filter_and_format(tmp_path, capsys):
    logger = setup_logging(tmp_path, "pre_trainer", rank=1, world_size=2, console_ranks=[0],
                           secrets=["hunter2-token"])
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
    assert "engine warning" in out and "broken" in out  # WARNING+ from every rank
