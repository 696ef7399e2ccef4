"""One top-level rule for every subcommand: a user error is one ``primus: error:`` line and exit 2
(argparse's own complaints included); an unexpected exception is one line pointing at a debug log
that holds the traceback (``--verbose`` prints it too), exit 1. A raw traceback never reaches the console.
"""
from __future__ import annotations

import argparse
import importlib
import re

import pytest

from primus.cli.main import build_parser, main
from tests.conftest import PRIMUS, TINY_EXAMPLE

# Per leaf subcommand: (argv that is well-formed, argv that argparse refuses).
COMMANDS = {
    ("train",): (["train", str(TINY_EXAMPLE)], ["train", str(TINY_EXAMPLE), "--nproc-per-node", "two"]),
    ("config", "show"): (["config", "show", str(TINY_EXAMPLE)], ["config", "show"]),
    ("config", "validate"): (["config", "validate", str(TINY_EXAMPLE)], ["config", "validate"]),
    ("prepare",): (["prepare", "core", "--dry-run"], ["prepare", "nothing"]),
    ("data", "tiny-corpus"): (["data", "tiny-corpus", "/tmp/x"], ["data", "tiny-corpus", "/tmp/x", "--docs", "x"]),
    ("data", "build-indexed"): (["data", "build-indexed", "c.jsonl", "--tokenizer", "t", "--output-prefix", "p"],
                                ["data", "build-indexed", "c.jsonl"]),
    ("data", "wan-preprocess"): (["data", "wan-preprocess", "v", "--pipeline", "p", "--output", "o"],
                                 ["data", "wan-preprocess", "v", "--pipeline", "p"]),
    ("data", "wan-tiny"): (["data", "wan-tiny", "--output", "o"],
                           ["data", "wan-tiny", "--output", "o", "--clips", "x"]),
    ("preflight",): (["preflight", "--dry-run"], ["preflight", "--timeout", "soon"]),
    ("plan",): (["plan", str(TINY_EXAMPLE)], ["plan"]),
    ("export",): (["export", "run", "--to", "hf", "out"], ["export", "run", "--to", "hf"]),
    ("patches",): (["patches"], ["patches", "--device"]),
}


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        yield path, parser
        return
    for name, child in subparsers[0].choices.items():
        yield from _leaves(child, (*path, name))


LEAVES = dict(_leaves(build_parser()))


def test_the_table_covers_every_subcommand():
    assert set(LEAVES) == set(COMMANDS)


def _one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.mark.parametrize("command", sorted(COMMANDS), ids=" ".join)
def test_a_malformed_command_line_is_one_line_exit_2(command, capsys):
    code = main(COMMANDS[command][1])
    line = _one_error_line(capsys.readouterr().err)
    assert code == 2 and line.startswith(f"primus: error: {' '.join(command)}: "), line
    assert "usage:" not in line and f"see primus {' '.join(command)} --help" in line


@pytest.mark.parametrize("command", sorted(COMMANDS), ids=" ".join)
def test_an_unexpected_exception_is_one_line_naming_a_debug_log(command, capsys, monkeypatch, tmp_path):
    handler = LEAVES[command].get_default("handler")

    def broken(args, extras):
        raise RuntimeError(f"simulated bug in {' '.join(command)}")

    monkeypatch.setattr(importlib.import_module(handler.__module__), handler.__name__, broken)
    monkeypatch.setenv("PRIMUS_DEBUG_DIR", str(tmp_path / "debug"))
    monkeypatch.delenv("PRIMUS_VERBOSE", raising=False)
    code = main(COMMANDS[command][0])
    line = _one_error_line(capsys.readouterr().err)
    assert code == 1 and line.startswith("primus: internal error"), line
    assert f"RuntimeError: simulated bug in {' '.join(command)}" in line and "--verbose prints it" in line
    log = re.search(r"the traceback is in (\S+?)[;\]]", line).group(1)
    text = open(log).read()
    assert "Traceback (most recent call last)" in text and "def broken" not in line and "in broken" in text


def test_verbose_prints_the_traceback_as_well(capsys, monkeypatch, tmp_path):
    import primus.cli.config_cmd as config_cmd

    monkeypatch.setattr(config_cmd, "_show", lambda args, extras: 1 / 0)
    monkeypatch.setenv("PRIMUS_DEBUG_DIR", str(tmp_path))
    monkeypatch.setenv("PRIMUS_VERBOSE", "1")
    assert main(["config", "show", str(TINY_EXAMPLE)]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ZeroDivisionError" in err
    assert err.strip().splitlines()[-1].startswith("primus: internal error")


def test_an_unwritable_debug_dir_still_ends_in_one_line(capsys, monkeypatch, tmp_path):
    import primus.cli.config_cmd as config_cmd

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(config_cmd, "_show", lambda args, extras: [][1])
    monkeypatch.setenv("PRIMUS_DEBUG_DIR", str(blocker / "below"))
    assert main(["config", "show", str(TINY_EXAMPLE)]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert "IndexError" in line and "the traceback is in" in line  # the temporary folder took it


@pytest.mark.e2e
def test_through_the_real_entry_point(tmp_path):
    """``python -m primus.cli.main``: argparse's error is one line on a real stderr, exit 2."""
    import subprocess

    result = subprocess.run([*PRIMUS, "export", "run", "--step", "abc", "--to", "hf", str(tmp_path / "o")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    line = _one_error_line(result.stderr)
    assert line == ("primus: error: export: argument --step: expected a whole number ≥ 0 (got 'abc') "
                    "(see primus export --help)")
