"""Every engine's validation says every mistake of a file at once: three typos, three lines, each with
the file:line where it was written, the dotted key and a did-you-mean (``ConfigError.of_all``)."""
from __future__ import annotations

import os
import re

import pytest
import yaml

from tests.helpers import ROOT, cli_in_process

TYPOS = {
    "torchtitan": ("torchtitan/llama3_tiny-pretrain.yaml",
                   {"trainig": {"steps": 1}, "checkpoint": {"intervall": 3}, "metrics": {"log_freqq": 1}},
                   ["trainig", "checkpoint.intervall", "metrics.log_freqq"], ["training", "interval", "log_freq"]),
    "megatron": ("megatron/llama3_tiny-pretrain.yaml",
                 {"train_iter": 3, "micro_batch_sise": 4, "seq_lenght": 64},
                 ["train_iter", "micro_batch_sise", "seq_lenght"], ["train_iters", "micro_batch_size", "seq_length"]),
    "nemo_automodel": ("nemo_automodel/llama3_tiny-sft-lora.yaml",
                       {"step_schedular": {}, "optimiser": {}, "checkpointt": {}},
                       ["step_schedular", "optimiser", "checkpointt"], ["step_scheduler", "optimizer", "checkpoint"]),
}


@pytest.mark.parametrize("engine", sorted(TYPOS))
def test_three_typos_are_three_lines_with_file_line_and_did_you_mean(engine, tmp_path):
    pytest.importorskip({"torchtitan": "torchtitan", "megatron": "megatron.core",
                         "nemo_automodel": "nemo_automodel"}[engine])
    example, typos, keys, suggestions = TYPOS[engine]
    tree = yaml.safe_load((ROOT / "examples" / example).read_text())
    tree["modules"]["pre_trainer"]["overrides"].update(typos)
    exp = tmp_path / "typos.yaml"
    exp.write_text(yaml.safe_dump(tree, sort_keys=False))
    result = cli_in_process("config", "validate", exp, env={**os.environ, "PRIMUS_WORKSPACE": str(tmp_path / "ws"),
                                                            "PRIMUS_CACHE": str(tmp_path / "cache")})
    lines = [line for line in result.stderr.splitlines() if line.startswith("primus: error:")]
    assert result.returncode == 2 and len(lines) == 3, result.stderr
    for line, key, suggestion in zip(sorted(lines, key=lambda l: [k in l for k in keys].index(True)), keys, suggestions):
        assert re.match(rf"primus: error: {re.escape(str(exp))}:\d+: modules\.pre_trainer\.{re.escape(key)}: ", line), line
        assert f"(did you mean '{suggestion}'?)" in line, line
    assert not (tmp_path / "ws").exists() and not (tmp_path / "cache").exists()
