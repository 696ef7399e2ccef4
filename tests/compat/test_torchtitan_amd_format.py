"""A TorchTitan module in AMD Primus's format resolves with AMD Primus's module preset and data rules.

AMD Primus trains on its mock tokens unless a file says ``training.mock_data: false`` (its pre_trainer.yaml
says ``true``; its patch replaces ``datasets.load_dataset`` whatever ``training.dataset`` names), then on
``training.dataset`` (its preset's ``c4`` when the file names none). Resolution only: no engine.
"""
import pytest

from primus.launch.experiment import resolve
from tests.conftest import write

AMD_FILE = """\
work_group: amd
user_name: root
exp_name: t
workspace: ./output
modules:
  pre_trainer:
    framework: torchtitan
    config: pre_trainer.yaml
    model: llama3.1_8B.yaml
    overrides:
      stderr_sink_level: INFO
{lines}"""


def _module(tmp_path, lines: str = "", cli=None):
    path = write(tmp_path / "exp.yaml", AMD_FILE.format(lines=lines))
    return resolve(path, cli or []).modules["pre_trainer"]


def _lines(module) -> list[str]:
    return [t.line() for t in module.translations]


@pytest.mark.parametrize("lines, dataset", [
    ("", "mock"),  # AMD's default: mock tokens
    ("      training: {dataset: c4_test}\n", "mock"),  # mock tokens whatever the dataset
    ("      training: {mock_data: true, dataset: c4_test}\n", "mock"),
    ("      training: {mock_data: false}\n", "c4"),  # AMD's preset's dataset
    ("      training: {mock_data: false, dataset: c4_test}\n", "c4_test"),
    ("      training: {dataset: c4_test, mock_data: false}\n", "c4_test"),  # the keys' order does not matter
])
def test_amd_format_trains_on_what_amd_primus_trains_on(tmp_path, lines, dataset):
    assert _module(tmp_path, lines).params["dataloader"]["dataset"] == dataset


def test_a_dataset_that_mock_data_hides_is_said(tmp_path):
    said = [line for line in _lines(_module(tmp_path, "      training: {dataset: c4_test}\n"))
            if line.startswith("translated training.dataset")]
    assert len(said) == 1 and "training.mock_data is true (AMD Primus's default)" in said[0], said
    off = _lines(_module(tmp_path, "      training: {mock_data: false}\n"))
    assert any("training.mock_data=false → dataloader.dataset=c4" in line for line in off), off


def test_amd_format_gets_amd_primus_defaults_and_primus_format_keeps_ours(tmp_path):
    amd = _module(tmp_path).params
    assert amd["optimizer"]["lr"] == 8e-4 and amd["compile"] == {"enable": True}
    assert amd["activation_checkpoint"] == {"mode": "none"} and "lr_scheduler" not in amd
    ours = resolve(write(tmp_path / "ours.yaml", AMD_FILE.format(lines="").replace(
        "      stderr_sink_level: INFO\n", "      training: {steps: 5}\n")), []).modules["pre_trainer"].params
    assert ours["optimizer"]["lr"] == 3e-4 and ours["compile"] == {"enable": False}
    assert ours["lr_scheduler"]["decay_ratio"] == 0.8 and ours["dataloader"]["dataset"] == "c4"


def test_a_primus_format_file_keeps_its_dataset_with_mock_data_off_on_the_command_line(tmp_path):
    path = write(tmp_path / "ours.yaml", AMD_FILE.format(lines="").replace(
        "      stderr_sink_level: INFO\n", "      training: {steps: 5}\n"))
    module = resolve(path, ["training.mock_data=false"]).modules["pre_trainer"]
    assert module.params["dataloader"]["dataset"] == "c4"


def test_selective_ac_without_amd_option_says_it_runs_per_op(tmp_path):
    """AMD's default selective_ac_option ("2": one layer in two) has no TorchTitan 0.3.0 equivalent."""
    module = _module(tmp_path, "      activation_checkpoint: {mode: selective}\n")
    assert module.params["activation_checkpoint"] == {"mode": "selective"}
    said = [line for line in _lines(module) if line.startswith("differs:")]
    assert said == ["differs: activation_checkpoint.selective_ac_option=2 → activation_checkpoint.mode=selective "
                    "(per-op) runs (AMD Primus's default option with mode: selective (its pre_trainer.yaml): "
                    "layer-wise, one layer in 2; TorchTitan 0.3.0's selective AC is per-op only)"]
    per_op = _module(tmp_path, "      activation_checkpoint: {mode: selective, selective_ac_option: op}\n")
    assert not [line for line in _lines(per_op) if line.startswith("differs:")]
