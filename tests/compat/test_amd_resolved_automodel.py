"""AMD Primus's NeMo AutoModel example files (Wan 2.2 A14B) train here what they train in AMD Primus, key by key.

``amd_resolved_automodel.json`` (``tools/gen_amd_resolved.py``, from AMD Primus fd1eeab's own files and its merge
rules) holds, for each of its AutoModel examples, the settings AMD Primus hands AutoModel (at the commit it
pins): the model and expert, the optimiser and its schedule, batch and length, the data loader, flow matching,
the layout, precision, recomputation, compile and the run's switches. The dict Primus hands AutoModel 0.7.0's
``TrainDiffusionRecipe`` for the same file, planned for the device in its folder, must say the same, except the
columns of ``ANNOUNCED`` (each said in a ``differs:`` line). Offline over the copies in tests/fixtures/amd_primus;
over the whole checkout with AMD_PRIMUS_CHECKOUT. Planning only: no training.
"""
import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest

from tests.compat.amd_resolution import (AMD_MIRROR, AUTOMODEL_TABLE, CHECKOUT, FIXTURES, ROOT, amd_table,
                                         primus_arguments, unexplained)

pytest.importorskip("nemo_automodel")  # the plan checks every key against AutoModel 0.7.0

# Where Primus runs something else, and says so in a differs: line (docs/compat.md, "Key by key against AMD
# Primus's own resolution"): a checkpoint goes to the run dir, not to AMD's /checkpoints/... path.
ANNOUNCED = {"checkpoint.checkpoint_dir": "differs: checkpoint.checkpoint_dir="}


def _compare(root: Path, key: str, row: list) -> list[str]:
    path, module = key.rsplit(":", 1)
    keys = amd_table(AUTOMODEL_TABLE)["keys"]
    with contextlib.redirect_stdout(io.StringIO()):
        values, lines, _ = primus_arguments(root / path, keys)
    enabled = dict(zip(keys, row))["checkpoint.enabled"]

    def same_run(name, amd, ours):  # with checkpoints off no directory is written, AMD's or the run dir
        return name == "checkpoint.checkpoint_dir" and enabled is False

    return unexplained(f"{path}:{module}", keys, row, values[module], lines[module], ANNOUNCED, same_run)


def _rows(root: Path) -> list[tuple[str, list]]:
    return [(key, row) for key, row in amd_table(AUTOMODEL_TABLE)["rows"].items()
            if (root / key.rsplit(":", 1)[0]).is_file()]


FIXTURE_ROWS = _rows(FIXTURES)


def test_the_fixtures_are_every_amd_automodel_example():
    assert len(FIXTURE_ROWS) == len(amd_table(AUTOMODEL_TABLE)["rows"]) == 4
    keys = amd_table(AUTOMODEL_TABLE)["keys"]
    assert len(keys) == 62
    # the settings the issue named, as AMD Primus resolves them for its pretrain file
    row = dict(zip(keys, amd_table(AUTOMODEL_TABLE)["rows"][
        "examples/nemo_automodel/configs/MI355X/diffusion/wan2_2_t2v_a14b-pretrain.yaml:pre_trainer"]))
    assert (row["optim.learning_rate"], row["optim.optimizer.betas"], row["optim.optimizer.weight_decay"]) == (
        5e-5, [0.9, 0.95], 0.1)
    assert row["fsdp.activation_checkpointing"] is True and row["data.dataloader.base_resolution"] == [512, 512]
    assert row["flow_matching.i2v_prob"] == 0.3 and row["model.attention_backend"] == "aiter"


@pytest.mark.parametrize("key, row", FIXTURE_ROWS, ids=[key.split("/")[-1] for key, _ in FIXTURE_ROWS])
def test_primus_trains_what_amd_primus_trains(key, row):
    assert _compare(FIXTURES, key, row) == []


def test_the_finetune_checkpoint_dir_is_said_once():
    """AMD's finetune file saves to /checkpoints/wan22_finetune_high; here to the run dir, in one differs: line."""
    from primus.compat.differs import lines_for
    from primus.launch.experiment import resolve

    path = FIXTURES / "examples/nemo_automodel/configs/MI355X/diffusion/wan2_2_t2v_a14b-finetune.yaml"
    lines = lines_for(resolve(path, []).modules["pre_trainer"])
    assert lines == ["differs: checkpoint.checkpoint_dir=/checkpoints/wan22_finetune_high → checkpoint.checkpoint_dir="
                     "{run dir}/checkpoints runs (Primus keeps a run's checkpoints in its run dir: "
                     "{workspace}/{work_group}/{user_name}/{exp_name}/checkpoints)"]


def test_the_amd_files_are_in_amd_format_and_primus_files_are_not():
    """AMD's pretrain files carry no AMD-only key: their shape (no stage:, AMD's model preset) marks them. Primus's
    own AutoModel experiments, the A14B copies that write stage: among them, keep Primus's presets."""
    from primus.compat import AMD_PRIMUS
    from primus.config.presets import load_with_extends

    def owns(path: Path) -> bool:
        data: dict = {}
        for layer in load_with_extends(path, "experiment"):
            data.update(layer.data)
        module = data["modules"]["pre_trainer"]
        return AMD_PRIMUS.owns(module["framework"], module.get("overrides"), model=module.get("model"),
                               stage_explicit="stage" in module)

    assert all(owns(FIXTURES / key.rsplit(":", 1)[0]) for key, _ in FIXTURE_ROWS)
    primus = [ROOT / "examples" / "nemo_automodel" / name for name in ("wan2_2_tiny-cpu.yaml",
                                                                          "llama3_tiny-sft-lora.yaml")]
    primus += sorted((ROOT / "examples" / "nemo_automodel" / "configs").rglob("*.yaml"))
    assert len(primus) == 6 and not any(owns(path) for path in primus)


@pytest.mark.skipif(not CHECKOUT, reason="set AMD_PRIMUS_CHECKOUT to an AMD Primus fd1eeab checkout")
def test_every_amd_automodel_example_trains_as_amd_primus_does():
    rows = _rows(Path(CHECKOUT))
    assert len(rows) == len(amd_table(AUTOMODEL_TABLE)["rows"])
    problems = [p for key, row in rows for p in _compare(Path(CHECKOUT), key, row)]
    assert problems == [], "\n".join(problems)


@pytest.mark.e2e
@pytest.mark.skipif(not AMD_MIRROR.is_dir(), reason=f"AMD Primus mirror not available ({AMD_MIRROR})")
def test_the_automodel_table_is_a_fresh_generation():
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_amd_resolved.py"), "--git-dir",
                             str(AMD_MIRROR), "--framework", "nemo_automodel", "--check", "--out-automodel",
                             str(AUTOMODEL_TABLE)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def test_a_stage_on_the_command_line_keeps_amd_primus_format():
    """The format is the files': AMD's pretrain file with stage=pretrain on the command line still trains AMD's values."""
    from primus.launch.experiment import resolve

    path = FIXTURES / "examples/nemo_automodel/configs/MI355X/diffusion/wan2_2_t2v_a14b-pretrain.yaml"
    params = resolve(path, ["modules.pre_trainer.stage=pretrain"]).modules["pre_trainer"].params
    assert params["optimizer"]["lr"] == 5e-5 and params["model"]["attention_backend"] == "aiter"

