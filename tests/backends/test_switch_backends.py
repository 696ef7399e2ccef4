"""The promise: one neutral model preset, and switching `framework:` (plus the module preset)
switches the engine. Both train the same tiny Llama through `primus train`."""

import pytest

from tests.conftest import write
from tests.helpers import read_events, read_metrics

pytestmark = [pytest.mark.e2e]

EXPERIMENT = """\
work_group: team
user_name: me
exp_name: ${NAME}
workspace: ${PRIMUS_WORKSPACE}
modules:
  pre_trainer:
    framework: ${FRAMEWORK}
    config: pre_trainer.yaml
    model: llama3_tiny.yaml
    overrides:
      primus: {tiny_assets: "${PRIMUS_CACHE}/tiny_llm"}
"""
STEPS = {"torchtitan": ["training.steps=6", "training.seq_len=64", "training.local_batch_size=4",
                        "optimizer.lr=3e-3", "lr_scheduler.warmup_steps=1", "activation_checkpoint.mode=none"],
         "megatron": ["train_iters=6", "seq_length=64", "micro_batch_size=4", "global_batch_size=4", "lr=3e-3",
                      "lr_warmup_iters=1", "bf16=false", "use_distributed_optimizer=false"]}


@pytest.mark.parametrize("framework", ["torchtitan", "megatron"])
def test_same_model_preset_on_both_engines(framework, run_primus, workspace, tmp_path):
    exp = write(tmp_path / "exp.yaml", EXPERIMENT)
    result = run_primus("train", exp, *STEPS[framework], env={"NAME": framework, "FRAMEWORK": framework})
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_metrics(workspace / "team" / "me" / framework)
    assert len(rows) == 6 and rows[-1]["loss"] < rows[0]["loss"]
    assert all(r["tokens_per_sec"] > 0 and r["tflops"] > 0 for r in rows)
    assert "[TRAIN] step=6 " in result.stdout
    [goodput] = read_events(workspace / "team" / "me" / framework, "goodput")  # every run ends with its goodput
    assert 0 < goodput["goodput"] < 1 and f"[primus] goodput: {100 * goodput['goodput']:.1f}% " in result.stdout
