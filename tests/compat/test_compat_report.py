"""tools/primus_compat.py over a small AMD-Primus-shaped checkout written for this test.

The TorchTitan experiment is in TorchTitan 0.2 / AMD Primus spelling (``optimizer.beta1``,
``training.dataset``, ``activation_checkpoint.selective_ac_option`` beside ``mode: none``,
``profiling``, ``primus_turbo``, sink levels): it must pass the real validate (TorchTitan 0.3.0's
``Trainer.Config``), plan on 8 ranks and the dry-run, unchanged.
"""
import os

import pytest

from tests.conftest import write
from tests.helpers import load_tool

TT02 = """\
work_group: AMD
user_name: root
exp_name: tiny-tt02
workspace: ./output
modules:
  pre_trainer:
    framework: torchtitan
    config: pre_trainer.yaml
    model: llama3_tiny.yaml
    overrides:
      sink_level: null
      file_sink_level: DEBUG
      stderr_sink_level: INFO
      model:
        hf_assets_path: {tokenizer}
      training:
        local_batch_size: 2
        seq_len: 64
        steps: 3
        dataset: c4_test
        mock_data: false
      optimizer:
        name: AdamW
        lr: 1.0e-3
        beta1: 0.9
        beta2: 0.99
      activation_checkpoint:
        mode: none
        selective_ac_option: op
      profiling:
        enable_profiling: false
        profile_freq: 10
      parallelism:
        expert_tensor_parallel_degree: 1
      primus_turbo:
        enable_primus_turbo: true
        use_turbo_attention: true
"""
FP8 = "work_group: AMD\nuser_name: root\nexp_name: f\nworkspace: ./o\nmodules:\n  pre_trainer:\n" \
      "    framework: megatron\n    config: pre_trainer.yaml\n    model: llama3_tiny.yaml\n    overrides:\n" \
      "      mock_data: true\n      fp8: hybrid\n      fp8_recipe: blockwise\n      ckpt_format: torch\n" \
      "      save: null\n      load: null\n"
MAXTEXT = "work_group: AMD\nuser_name: root\nexp_name: m\nworkspace: ./o\nmodules:\n  pre_trainer:\n" \
          "    framework: maxtext\n    config: pre_trainer.yaml\nenv:\n  XLA_FLAGS: x\n"
ZEBRA = "work_group: AMD\nuser_name: root\nexp_name: z\nworkspace: ./o\nmodules:\n  pre_trainer:\n" \
        "    framework: megatron\n    config: pre_trainer.yaml\n    model: zebra_llama_1B.yaml\n"
TYPO = "work_group: AMD\nuser_name: root\nexp_name: t\nworkspace: ./o\nmodules:\n  pre_trainer:\n" \
       "    framework: megatron\n    config: pre_trainer.yaml\n    model: llama3_tiny.yaml\n    overrides:\n" \
       "      mock_date: true\n"


@pytest.fixture(scope="module")
def compat_tool():
    return load_tool("primus_compat")


def test_the_report_over_a_checkout(tmp_path, compat_tool, monkeypatch):
    pytest.importorskip("torchtitan")
    monkeypatch.chdir(tmp_path)
    tokenizer = write(tmp_path / "tok" / "tokenizer.json", "{}").parent
    checkout = tmp_path / "amd"
    write(checkout / "examples/torchtitan/configs/MI300X/tiny-pretrain.yaml", TT02.format(tokenizer=tokenizer))
    write(checkout / "examples/megatron/configs/MI300X/tiny-typo.yaml", TYPO)
    write(checkout / "examples/megatron/configs/MI300X/tiny-fp8.yaml", FP8)
    write(checkout / "examples/megatron/configs/MI300X/zebra_llama_1B-pretrain.yaml", ZEBRA)
    write(checkout / "examples/maxtext/configs/MI300X/llama2_7B-pretrain.yaml", MAXTEXT)
    write(checkout / "examples/README.yaml", "not: an experiment\n")
    out = tmp_path / "compat.md"  # a document with the report between markers: the rest is kept
    out.write_text(f"# Compatibility\n\nWritten by hand.\n{compat_tool.BEGIN}\nold report\n{compat_tool.END}\nAfter.\n")
    environment = dict(os.environ)
    assert compat_tool.main([str(checkout), "--out", str(out)]) == 0
    assert dict(os.environ) == environment  # NNODES=1 leaked into later tests' `primus plan` world size
    text = out.read_text()
    assert text.startswith("# Compatibility\n\nWritten by hand.\n") and text.endswith(f"{compat_tool.END}\nAfter.\n")
    assert "old report" not in text
    assert "examples (MI300X / MI325X / MI355X): 1 / 3 are admitted on the device in their folder name and pass " \
        "validate + plan + dry-run unchanged on the nodes they are written for, 8 GPUs each (33.3%): 1 on one node " \
        "(8 ranks), 0 layouts for 2 to 16 nodes" in text
    assert "| MI300X | 3 | 1 | 0 | 1 | 0 | 1 |" in text  # per device: pass, multi-node, not admitted, inputs, fail
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| examples/")}
    assert set(rows) == {"examples/torchtitan/configs/MI300X/tiny-pretrain.yaml",
                         "examples/megatron/configs/MI300X/tiny-typo.yaml",
                         "examples/megatron/configs/MI300X/tiny-fp8.yaml",
                         "examples/megatron/configs/MI300X/zebra_llama_1B-pretrain.yaml",
                         "examples/maxtext/configs/MI300X/llama2_7B-pretrain.yaml"}
    assert "| mi300x | pass |" in rows["examples/torchtitan/configs/MI300X/tiny-pretrain.yaml"]
    fp8 = rows["examples/megatron/configs/MI300X/tiny-fp8.yaml"]
    # FP8 is admitted on an MI300X (Transformer Engine assumed), but not the blockwise recipe (no ROCm kernels)
    assert "| mi300x | not admitted |" in fp8 and "modules.pre_trainer.fp8_recipe: 'blockwise' cannot run on mi300x" in fp8
    assert "| `fp8_recipe` | 1 | 1 | the blockwise recipe needs NVIDIA SM 9.0+ with CUDA 12.9+" in text
    assert "ckpt_format" not in text  # AMD's ckpt_format: torch with save/load null: never a refusal
    assert "fail: validate" in rows["examples/megatron/configs/MI300X/tiny-typo.yaml"]
    assert "did you mean 'mock_data'?" in rows["examples/megatron/configs/MI300X/tiny-typo.yaml"]
    assert "| refused | examples/megatron/configs/MI300X/zebra_llama_1B-pretrain.yaml:9: model preset" \
        in rows["examples/megatron/configs/MI300X/zebra_llama_1B-pretrain.yaml"]
    assert "MaxText is a JAX trainer" in rows["examples/maxtext/configs/MI300X/llama2_7B-pretrain.yaml"]
    assert "- 1 × mock_date: unknown Megatron argument (did you mean '…'?)" in text
