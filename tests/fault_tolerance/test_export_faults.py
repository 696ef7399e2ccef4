"""An export is whole or absent: OUT_DIR is written into a temporary sibling and renamed at the end,
the checkpoint is verified before it is read, and every bad input is one line, exit 2.

- A damaged run (``config.resolved.yaml`` empty, not YAML, a list, a module without params; the
  newest checkpoint truncated, unfinished or another engine's) falls back to the newest whole
  checkpoint, said in one line, or is one line naming the damaged file; OUT_DIR untouched.
- OUT_DIR that is a file, ``/dev/null``, a dangling link, below a file, read-only or on a full disk:
  one line, nothing left behind.
- A killed export (SIGKILL while writing) leaves no OUT_DIR that loads as a model; the re-run
  succeeds. Two exports into one OUT_DIR at once: one is refused, never both "succeed".

The trained runs are real (TorchTitan 2 steps, Megatron 4 iterations, tiny models on CPU);
exports run in this process where no process needs killing.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import PRIMUS, ROOT
from tests.fault_tolerance.conftest import TRAINED
from tests.helpers import cli_in_process

# In the export subprocess only: once the weights are written, the export stalls (the file
# PRIMUS_T_STALL_WRITE says so) until the file PRIMUS_T_RELEASE appears, so the test can kill it
# mid-write or start a second export meanwhile.
STALL = '''import os, time
if os.environ.get("PRIMUS_T_STALL_WRITE"):
    import safetensors.torch as st
    _save = st.save_file
    def save_file(*args, **kwargs):
        _save(*args, **kwargs)
        open(os.environ["PRIMUS_T_STALL_WRITE"], "w").close()
        deadline = time.monotonic() + 300
        while not os.path.exists(os.environ["PRIMUS_T_RELEASE"]) and time.monotonic() < deadline:
            time.sleep(0.1)
    st.save_file = save_file
'''


@pytest.fixture
def titan_run(titan_trained):
    return titan_trained / "amd" / "root" / TRAINED


@pytest.fixture
def megatron_run(megatron_trained):
    return megatron_trained / "amd" / "root" / TRAINED


@pytest.fixture
def copy_of(tmp_path):
    def copy(run: Path) -> Path:
        return Path(shutil.copytree(run, tmp_path / "run" / run.name, symlinks=True))
    return copy


def _export(*args: object, env: dict[str, str] | None = None):
    return cli_in_process("export", *args, env={**os.environ, **(env or {})})


def _one_line(result, code: int = 2) -> str:
    lines = [line for line in result.stderr.strip().splitlines() if line]
    assert result.returncode == code, result.stdout[-2000:] + result.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def _loads_as_model(out: Path) -> bool:
    from transformers import AutoModelForCausalLM

    try:
        AutoModelForCausalLM.from_pretrained(str(out))
        return True
    except Exception:  # noqa: BLE001 - any failure to load means "not a model"
        return False


# -- the run directory's config ----------------------------------------------------------------------
def _fake_run(tmp_path: Path, text: str) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.resolved.yaml").write_text(text)
    return run


@pytest.mark.parametrize("text, fragment", [
    ("", "damaged (written by Primus at launch; restore it from a copy, or re-launch the run): empty"),
    ("a: [\n", "config.resolved.yaml:2: invalid YAML"),
    ("- a\n- b\n", "a list, not a mapping"),
    ("exp_name: x\n", "no 'modules' mapping"),
    ("modules: {pre_trainer: {framework: torchtitan}}\n", "modules.pre_trainer.params is missing or not a dict"),
    ("modules: {pre_trainer: 3}\n", "modules.pre_trainer is not a mapping"),
    ("modules: {pre_trainer: {params: {}}}\n", "modules.pre_trainer.framework is missing"),
    (b"modules: \xff\n", "config.resolved.yaml:1: not UTF-8"),
])
def test_a_damaged_config_is_one_line_naming_it(tmp_path, text, fragment):
    run = _fake_run(tmp_path, "")
    (run / "config.resolved.yaml").write_bytes(text if isinstance(text, bytes) else text.encode())
    line = _one_line(_export(run, "--to", "hf", tmp_path / "out"))
    assert str(run / "config.resolved.yaml") in line and fragment in line, line
    assert not (tmp_path / "out").exists()


def test_not_a_run_directory(tmp_path):
    assert "not a Primus run directory" in _one_line(_export(tmp_path, "--to", "hf", tmp_path / "out"))


# -- OUT_DIR -------------------------------------------------------------------------------------------
def test_out_dir_that_cannot_be_a_folder(tmp_path):
    run = _fake_run(tmp_path, "modules: {pre_trainer: {framework: torchtitan, params: {}}}\n")
    regular = tmp_path / "file"
    regular.write_text("keep")
    dangling = tmp_path / "link"
    dangling.symlink_to(tmp_path / "nowhere")
    cases = {regular: "exists and is not a folder", Path("/dev/null"): "/dev/null exists and is not a folder",
             dangling: "is a symbolic link to", regular / "below": f"{regular} is a file, not a folder"}
    for out, fragment in cases.items():
        line = _one_line(_export(run, "--to", "hf", out))
        assert line.startswith("primus: error: OUT_DIR: ") and fragment in line, line
    assert regular.read_text() == "keep" and not (tmp_path / "nowhere").exists()


def test_out_dir_that_is_not_empty_is_refused(tmp_path):
    run = _fake_run(tmp_path, "modules: {pre_trainer: {framework: torchtitan, params: {}}}\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep")
    assert "exists and is not empty" in _one_line(_export(run, "--to", "hf", tmp_path / "out"))
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["mine.txt"]


@pytest.mark.parametrize("args, fragment", [
    (["--step", "abc", "--to", "hf", "o"], "argument --step: expected a whole number ≥ 0 (got 'abc')"),
    (["--step", "-1", "--to", "hf", "o"], "argument --step: must be ≥ 0"),
    (["--to", "hf"], "argument --to: expected 2 arguments"),
    (["--to", "onnx", "o"], "--to onnx: unknown format"),
])
def test_bad_flags_are_one_line(tmp_path, args, fragment):
    line = _one_line(_export(tmp_path, *args))
    assert line.startswith("primus: error: ") and fragment in line and "usage:" not in line, line


@pytest.fixture
def mount(tmp_path):
    """A small tmpfs (root only): ``mount(size, readonly)`` -> its folder."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a tmpfs")
    mounted = []

    def make(size: str, readonly: bool = False) -> Path:
        point = tmp_path / f"disk{len(mounted)}"
        point.mkdir()
        options = f"size={size}" + (",ro" if readonly else "")
        if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)]).returncode != 0:
            pytest.skip("cannot mount a tmpfs here")
        mounted.append(point)
        return point

    yield make
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)])


def test_a_read_only_place_is_one_line(tmp_path, mount):
    run = _fake_run(tmp_path, "modules: {pre_trainer: {framework: torchtitan, params: {}}}\n")
    line = _one_line(_export(run, "--to", "hf", mount("1m", readonly=True) / "out"))
    assert "OUT_DIR: " in line and "cannot be written" in line, line


# -- checkpoints, on real runs -------------------------------------------------------------------------
@pytest.mark.e2e
def test_a_full_disk_leaves_nothing(titan_run, copy_of, mount):
    disk = mount("1m")  # the weights are 2 MB
    line = _one_line(_export(copy_of(titan_run), "--to", "hf", disk / "out"))
    assert "OUT_DIR: cannot write" in line and "No space left on device" in line and "nothing was left" in line
    assert list(disk.iterdir()) == []


def _truncate_shard(step: Path) -> Path:
    shard = next(step.glob("*.distcp"))
    os.truncate(shard, 100)
    return shard


@pytest.mark.e2e
@pytest.mark.parametrize("damage", ["truncated", "no .metadata", ".metadata a folder", "a Megatron checkpoint"])
def test_a_damaged_newest_torchtitan_checkpoint_falls_back_said_in_one_line(damage, titan_run, megatron_run,
                                                                           copy_of, tmp_path):
    run = copy_of(titan_run)
    newest = run / "checkpoints" / "step-2"
    if damage == "truncated":
        bad = _truncate_shard(newest)
    elif damage == "no .metadata":
        (newest / ".metadata").unlink()
    elif damage == ".metadata a folder":
        (newest / ".metadata").unlink()
        (newest / ".metadata").mkdir()
    else:
        shutil.rmtree(newest)
        shutil.copytree(megatron_run / "checkpoints" / "iter_0000004", newest)
    before = sorted(p.name for p in newest.iterdir())
    result = _export(run, "--to", "hf", tmp_path / "out")
    assert result.returncode == 0, result.stderr[-2000:]
    warnings = [line for line in result.stdout.splitlines() if "warning" in line]
    assert len(warnings) == 1 and f"using {run / 'checkpoints' / 'step-1'} (step 1) instead" in warnings[0]
    assert str(newest) in warnings[0]
    assert "exported" in result.stdout and "(step 1," in result.stdout
    assert sorted(p.name for p in newest.iterdir()) == before  # nothing moved or deleted by an export
    assert _loads_as_model(tmp_path / "out")
    if damage == "truncated":
        step = _one_line(_export(run, "--step", "2", "--to", "hf", tmp_path / "out2"))
        assert f"--step 2: {bad} is truncated (100 of" in step and not (tmp_path / "out2").exists()


@pytest.mark.e2e
def test_no_whole_checkpoint_is_one_line_naming_the_newest_damage(titan_run, copy_of, tmp_path):
    run = copy_of(titan_run)
    _truncate_shard(run / "checkpoints" / "step-1")
    shard = _truncate_shard(run / "checkpoints" / "step-2")
    line = _one_line(_export(run, "--to", "hf", tmp_path / "out"))
    assert f"no usable checkpoint; the newest: {shard} is truncated" in line
    assert not (tmp_path / "out").exists()
    checkpoints = run / "checkpoints"
    shutil.rmtree(checkpoints)
    checkpoints.write_text("not a folder")
    assert f"{checkpoints} is not a folder" in _one_line(_export(run, "--to", "hf", tmp_path / "out"))


@pytest.mark.e2e
@pytest.mark.parametrize("damage", ["truncated shard", "unfinished save"])
def test_a_damaged_newest_megatron_checkpoint_falls_back(damage, megatron_run, copy_of, tmp_path):
    run = copy_of(megatron_run)
    newest = run / "checkpoints" / "iter_0000004"
    if damage == "truncated shard":
        _truncate_shard(newest)
    else:
        (newest / ".metadata").unlink()
        (newest / "metadata.json").unlink()
    result = _export(run, "--to", "hf", tmp_path / "out")
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"using {run / 'checkpoints' / 'iter_0000002'} (step 2) instead" in result.stdout
    assert _loads_as_model(tmp_path / "out")


# -- killed and concurrent exports ---------------------------------------------------------------------
def _export_process(run: Path, out: Path, tmp_path: Path, *extra: str, stall: Path | None = None) -> subprocess.Popen:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(STALL)
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    if stall is not None:
        env.update(PRIMUS_T_STALL_WRITE=str(stall), PRIMUS_T_RELEASE=str(tmp_path / "release"))
    return subprocess.Popen([*PRIMUS, "export", str(run), *extra, "--to", "hf", str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.1)


@pytest.mark.e2e
def test_a_killed_export_leaves_no_model_and_the_rerun_succeeds(titan_run, tmp_path):
    out = tmp_path / "out"
    stalled = tmp_path / "writing"
    export = _export_process(titan_run, out, tmp_path, stall=stalled)
    _wait_for(stalled, export)  # the weights are written, config.json and the tokenizer not yet
    export.send_signal(signal.SIGKILL)
    export.wait(timeout=60)
    assert not out.exists() or not _loads_as_model(out)
    again = _export(titan_run, "--to", "hf", out)  # in this process: nothing to stall or kill
    assert again.returncode == 0, again.stderr[-2000:]
    assert _loads_as_model(out)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out")) == []  # no leftovers, no lock


@pytest.mark.e2e
def test_two_exports_into_one_folder_one_is_refused(titan_run, tmp_path):
    out = tmp_path / "out"
    stalled = tmp_path / "writing"
    first = _export_process(titan_run, out, tmp_path, "--step", "1", stall=stalled)
    _wait_for(stalled, first)  # holds OUT_DIR's lock, mid-write
    line = _one_line(_export(titan_run, "--step", "2", "--to", "hf", out))  # this process: another pid
    assert f"OUT_DIR {out}: pid {first.pid} is writing it right now" in line
    (tmp_path / "release").touch()
    stdout, stderr = first.communicate(timeout=600)
    assert first.returncode == 0, stderr[-2000:]
    assert "(step 1," in stdout and _loads_as_model(out)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out")) == []
