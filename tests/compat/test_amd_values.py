"""AMD Primus keys with values of the wrong type, hostile pipeline layouts and unset variables in
``bases:``: one ``primus: error:`` line (file:line, the key or the variable), exit 2, in bounded time."""
from __future__ import annotations

import time

import pytest

from tests.conftest import ROOT, write
from tests.helpers import cli_in_process

MEGATRON = ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml"


def _amd(tmp_path, lines: str):
    return write(tmp_path / "exp.yaml", MEGATRON.read_text().replace("      train_iters: 20\n",
                                                                      f"      train_iters: 20\n{lines}"))


def _refused(result, *fragments: str) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stdout[-1500:] + result.stderr[-1500:]
    assert len(lines) == 1 and lines[0].startswith("primus: error: ") and "Traceback" not in result.stderr, lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("line, fragment", [
    ("disable_last_saving: maybe", "modules.pre_trainer.disable_last_saving: maybe is not true or false"),
    ("auto_continue_train: {a: 1}", "modules.pre_trainer.auto_continue_train: {'a': 1} is not true or false"),
    ("disable_tensorboard: [1]", "modules.pre_trainer.disable_tensorboard: [1] is not true or false"),
    ("disable_wandb: 2", "modules.pre_trainer.disable_wandb: 2 is not true or false"),
])
def test_an_on_off_key_with_another_value_is_refused(tmp_path, line, fragment):
    exp = _amd(tmp_path, f"      {line}\n")
    _refused(cli_in_process("config", "validate", exp, "--no-engine"), f"exp.yaml:16: {fragment}")


@pytest.mark.parametrize("value", [True, False, 0, 1])
def test_an_on_off_key_takes_true_false_0_and_1(tmp_path, value):
    exp = _amd(tmp_path, f"      disable_last_saving: {str(value).lower()}\n")
    result = cli_in_process("config", "show", exp, "--why", "primus.save_last_checkpoint")
    assert result.returncode == 0, result.stderr
    assert f"=> {str(not value).lower()}" in result.stdout.replace("True", "true").replace("False", "false")


@pytest.mark.parametrize("layout", ["t*99999999999", "(t|)*999999999", "E,(tt|)*99999999999999999999,L",
                                    "E" + "t" * 100_000 + "L", "Et*" + "9" * 5000 + "L"])
def test_a_layout_that_expands_beyond_the_model_is_refused_fast(layout, tmp_path):
    from primus.config.errors import ConfigError
    from primus.plan.layout import parse_pipeline_layout

    line = _refused(cli_in_process("config", "validate", MEGATRON, "--no-engine",
                                   f"pipeline_model_parallel_layout={layout}"),
                    "modules.pre_trainer.pipeline_model_parallel_layout: pipeline layout")
    assert "more than 272" in line  # the 2-layer model's bound, not the global one
    started = time.monotonic()
    with pytest.raises(ConfigError):
        parse_pipeline_layout(layout)  # no layer count: the global bound, before anything is expanded
    assert time.monotonic() - started < 5  # a hang guard: it takes milliseconds


def test_a_layout_that_fits_still_parses():
    from primus.plan.layout import layout_bound, parse_pipeline_layout

    assert parse_pipeline_layout("E,(tt|)*2,L", 4) == ["Ett", "tt", "L"]
    assert parse_pipeline_layout("Et*126L", 126) == ["E" + "t" * 126 + "L"]
    assert layout_bound(None) == 2**16 and layout_bound(2) == 272


def test_an_unset_variable_in_bases_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("PRIMUS_T_UNSET_BASE", raising=False)
    exp = write(tmp_path / "exp.yaml", "bases:\n  - ${PRIMUS_T_UNSET_BASE}/base.yaml\n" + MEGATRON.read_text())
    _refused(cli_in_process("config", "validate", exp, "--no-engine"),
             "exp.yaml:1: environment variable PRIMUS_T_UNSET_BASE is not set")
    empty = write(tmp_path / "empty.yaml", "bases:\n  - ${PRIMUS_T_UNSET_BASE:}/base.yaml\n" + MEGATRON.read_text())
    _refused(cli_in_process("config", "validate", empty, "--no-engine"),
             "bases (written '${PRIMUS_T_UNSET_BASE:}/base.yaml'", "'/base.yaml' not found")
