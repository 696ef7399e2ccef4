"""`primus plan` of a TorchTitan experiment reads primus/backends/torchtitan/plan_table.json instead of
importing TorchTitan: the table is what tools/gen_torchtitan_plan_table.py reads from the installed
TorchTitan, and the plan it gives is the one TorchTitan's own config gives."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT

pytest.importorskip("torchtitan")

EXAMPLES = sorted((ROOT / "examples" / "torchtitan").glob("*pretrain*.yaml"))
# one flavor of each model family the table holds, and Primus's Llama 4 (the engine's path)
PRESETS = ["llama3.1_8B", "qwen3_0.6b", "deepseek_v3_16b", "gpt_oss_20b", "llama4_17Bx16E", "deepseek_v3_tiny"]


@pytest.mark.e2e
def test_the_table_is_a_fresh_generation():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_torchtitan_plan_table.py"), "--check"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]


def _experiment(tmp_path, preset: str):
    path = tmp_path / f"{preset}.yaml"
    path.write_text(yaml.safe_dump({
        "work_group": "t", "user_name": "t", "exp_name": "p", "workspace": str(tmp_path / "ws"),
        "modules": {"pre_trainer": {"framework": "torchtitan", "config": "pre_trainer.yaml", "model": f"{preset}.yaml",
                                    "overrides": {"training": {"local_batch_size": 1, "seq_len": 2048}}}}}))
    return path


@pytest.mark.parametrize("source", [*EXAMPLES, *PRESETS], ids=lambda s: getattr(s, "stem", s))
def test_the_plan_without_the_engine_is_the_engines(tmp_path, source):
    from primus.config.resolve import resolve_experiment
    from primus.launch.job import describe_module, plan_module, select_module
    from primus.runtime.registry import backend_defaults, backend_derived

    path = source if not isinstance(source, str) else _experiment(tmp_path, source)
    resolved = resolve_experiment(str(path), [], backend_defaults, backend_derived)
    module = select_module(resolved, None)
    _, engine = plan_module(resolved, module, 8, require_engine=False)
    assert describe_module(resolved, module, 8) == (engine.model, engine.layout)


def test_a_misspelt_key_the_plan_reads_is_one_line(tmp_path, capsys):
    from tests.helpers import cli_in_process

    out = cli_in_process("plan", ROOT / "examples" / "torchtitan" / "llama3_tiny-pretrain.yaml",
                         "parallelism.tensor_paralel_degree=2")
    assert out.returncode == 2
    assert "modules.pre_trainer.parallelism.tensor_paralel_degree: unknown key for TorchTitan's parallelism config " \
           "(did you mean 'tensor_parallel_degree'?)" in out.stderr
