"""Every executor's --dry-run prints exactly what it would run: snapshot-tested.

Temp paths, the interpreter and the repo are normalised. Refresh the snapshots after an
intended change with ``PRIMUS_UPDATE_SNAPSHOTS=1 pytest tests/launch/test_dry_run_snapshots.py``.
"""
import os
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY_EXAMPLE, write

pytestmark = pytest.mark.e2e  # every test here starts Primus or an engine in another process

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = bool(os.environ.get("PRIMUS_UPDATE_SNAPSHOTS"))
pytest.importorskip("torchtitan")

CASES = {
    "local": [],
    "local-2proc": ["--nproc-per-node", "2"],
    "multi-node-rank1": ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.1.0.1", "--master-port", "29400",
                         "--rdzv-id", "job-7", "--rdzv-timeout", "60"],
    "slurm": ["--slurm", "-N", "2", "--partition", "mi300", "--time", "01:00:00", "--account", "proj",
              "--gpus-per-node", "8", "training.steps=4", "--", "--qos=high", "--exclusive"],
    "slurm-container-engine": ["--slurm", "-N", "2", "--container", "rocm/primus:v1", "--container-engine", "podman"],
    "srun": ["--srun", "training.steps=4"],
    "container-docker": ["--container", "rocm/primus:v1", "--container-engine", "docker", "--nnodes", "2",
                         "--node-rank", "0", "--master-addr", "n1", "training.steps=4"],
    "container-apptainer": ["--container", "/images/primus.sif", "--container-engine", "apptainer",
                            "--container-env-secrets"],
}


def _normalise(text: str, tmp_path: Path) -> str:
    for value, name in ((str(tmp_path), "<TMP>"), (sys.executable, "<PYTHON>"), (str(ROOT), "<REPO>"),
                        (sys.base_prefix, "<PYBASE>"), (sys.prefix, "<VENV>")):
        text = text.replace(value, name)
    return re.sub(r"--master-port=\d+", "--master-port=<PORT>", text)  # single node: a free port


@pytest.mark.parametrize("case", sorted(CASES))
def test_dry_run_snapshot(case, tmp_path, monkeypatch, capsys):
    """In-process (one engine import for all cases), with a clean environment."""
    from primus.cli.main import main

    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), "PRIMUS_WORKSPACE": str(tmp_path / "ws"),
           "PRIMUS_CACHE": str(tmp_path / "cache"), "PRIMUS_USER_CONFIG": str(tmp_path / "none.yaml"),
           "NCCL_DEBUG": "INFO", "HF_TOKEN": "hf_do_not_print"}
    if case == "srun":  # as inside `salloc -N 2`
        env.update({"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "gpu[1-2]",
                    "MASTER_ADDR": "gpu1", "PRIMUS_JOB_ID": "slurm-77-1"})
    if case.startswith("slurm"):
        fake_srun = write(tmp_path / "bin" / "srun", "#!/bin/sh\necho no pyxis here\n")  # srun --help
        fake_srun.chmod(0o755)
        env["PATH"] = f"{fake_srun.parent}:{env['PATH']}"
    for name in list(os.environ):
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(ROOT)
    argv = ["train", str(TINY_EXAMPLE), "--dry-run", *CASES[case]]
    monkeypatch.setattr(sys, "argv", ["primus", *argv])
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    text = _normalise(capsys.readouterr().out, tmp_path)
    assert "hf_do_not_print" not in text and not (tmp_path / "ws").exists()  # a dry run writes nothing
    snapshot = SNAPSHOTS / f"{case}.txt"
    if UPDATE or not snapshot.exists():
        snapshot.write_text(text)
    assert text == snapshot.read_text()


def test_srun_outside_an_allocation_is_a_user_error(run_primus):
    out = run_primus("train", TINY_EXAMPLE, "--srun", "--dry-run", env={"SLURM_JOB_ID": ""})
    assert out.returncode == 2 and "not inside a Slurm allocation" in out.stderr


def test_sbatch_flags_need_slurm(run_primus):
    out = run_primus("train", TINY_EXAMPLE, "--dry-run", "--", "--qos=x")
    assert out.returncode == 2 and "are sbatch flags (use with --slurm)" in out.stderr
