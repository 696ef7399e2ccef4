"""Real preflight runs on CPU: 2 ranks through torchrun, and ranks that never join.

Each run is a subprocess under a hard timeout, so a hang fails the test instead of the suite.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from primus.preflight.perf.collectives import bus_factor

LAUNCH = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
          "-m", "primus.preflight.worker"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(cmd: list[str], options: dict, tmp: Path, env: dict | None = None, limit: float = 100) -> subprocess.CompletedProcess:
    path = tmp / "options.json"
    path.write_text(json.dumps(options))
    return subprocess.run([*cmd, str(path)], capture_output=True, text=True, timeout=limit,
                          env={**os.environ, **(env or {})}, cwd=tmp)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("quick")
    (tmp / "thresholds.yaml").write_text("performance:\n  straggler_fail_fraction: 0  # shared CI CPUs are noisy\n")
    options = {"quick": True, "report_dir": str(tmp / "report"), "timeout": 60,
               "thresholds": str(tmp / "thresholds.yaml")}
    started = time.monotonic()
    proc = _run(LAUNCH, options, tmp, limit=300)
    return proc, tmp / "report", time.monotonic() - started


def test_two_rank_quick_writes_json_markdown_pdf(quick_run):
    proc, report_dir, seconds = quick_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert seconds < 240  # a hang guard (well under a minute on an idle host)
    report = json.loads((report_dir / "report.json").read_text())
    assert report["status"] == "pass" and report["exit_code"] == 0
    assert report["world"]["world_size"] == 2 and report["world"]["joined"] == [0, 1]
    assert not [f for f in report["findings"] if f["level"] == "fail"]
    assert any(f["check"] == "accelerators" and "no accelerator" in f["message"] for f in report["findings"])
    assert any("intra-node collectives only" in f["message"] for f in report["findings"])
    assert report["thresholds"]["performance"]["straggler_fail_fraction"] == 0
    gemm = report["measurements"]["gemm"]
    assert [g["rank"] for g in gemm] == [0, 1] and all(g["gflops"] > 0 for g in gemm)
    ops = {row["op"] for row in report["measurements"]["collectives"]}
    assert ops == {"allreduce", "allgather", "reducescatter", "alltoall", "sendrecv"}
    markdown = (report_dir / "report.md").read_text()
    assert markdown.startswith("# Primus preflight: PASS") and "| allreduce" not in markdown.split("## Findings")[0]
    assert (report_dir / "busbw.png").is_file() and (report_dir / "gemm.png").is_file()
    pdf = (report_dir / "report.pdf").read_bytes()
    assert pdf.startswith(b"%PDF-") and pdf.rstrip().endswith(b"%%EOF")


def test_busbw_recomputes_from_json(quick_run):
    _, report_dir, _ = quick_run
    rows = json.loads((report_dir / "report.json").read_text())["measurements"]["collectives"]
    assert len(rows) == 5 * 3  # five collectives x the quick sizes
    for row in rows:
        assert row["seconds"] == max(row["per_rank_seconds"].values())  # the slowest rank
        algbw = row["size"] / row["seconds"] / 1e9
        assert row["algbw_gbps"] == pytest.approx(algbw, rel=1e-9)
        assert row["busbw_gbps"] == pytest.approx(algbw * bus_factor(row["op"], row["n"]), rel=1e-9)
    allreduce = next(r for r in rows if r["op"] == "allreduce")
    assert allreduce["busbw_gbps"] == pytest.approx(allreduce["algbw_gbps"] * 2 * (2 - 1) / 2)


@pytest.mark.skipif(not shutil.which("pdftoppm"), reason="pdftoppm (poppler-utils) is not installed")
def test_pdf_renders_to_png(quick_run, tmp_path):
    _, report_dir, _ = quick_run
    subprocess.run(["pdftoppm", "-png", "-r", "40", str(report_dir / "report.pdf"), str(tmp_path / "page")],
                   check=True, timeout=60)
    pages = sorted(tmp_path.glob("page*.png"))
    assert pages and pages[0].read_bytes().startswith(b"\x89PNG")


@pytest.mark.e2e
def test_rank_that_never_starts_is_named(tmp_path):
    """WORLD_SIZE=2 but only rank 0 starts: the report names rank 1 within the timeout."""
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    options = {"quick": True, "report_dir": str(tmp_path / "report"), "timeout": 3, "tests": "gemm"}
    started = time.monotonic()
    proc = _run([sys.executable, "-m", "primus.preflight.worker"], options, tmp_path, env, limit=180)
    assert time.monotonic() - started < 150  # a hang guard: the 3 s join timeout ends it
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "rank 1" in proc.stdout and "did not join within 3 s" in proc.stdout
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    missing = [f for f in report["findings"] if f["check"] == "connectivity" and f["level"] == "fail"]
    assert missing[0]["ranks"] == [1] and f"rank 1 ({socket.gethostname()}, node 0)" in missing[0]["message"]
    assert "did not join" in (tmp_path / "report" / "report.md").read_text()


@pytest.mark.e2e
def test_rank_that_stalls_under_torchrun_is_named(tmp_path):
    """Rank 1 is started but never joins (simulated): rank 0 names it, exits 1, torchrun stops rank 1."""
    options = {"quick": True, "report_dir": str(tmp_path / "report"), "timeout": 4, "tests": "gemm",
               "simulate_absent_ranks": [1]}
    started = time.monotonic()
    proc = _run(LAUNCH, options, tmp_path, limit=240)
    assert time.monotonic() - started < 200  # a hang guard: the 4 s join timeout ends it
    assert proc.returncode != 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["exit_code"] == 1 and report["world"]["joined"] == [0]
    assert any(f["ranks"] == [1] and "did not join" in f["message"] for f in report["findings"])


@pytest.mark.e2e
def test_cli_one_process(tmp_path):
    """`primus preflight` with one process runs in-process through the launcher."""
    proc = subprocess.run([sys.executable, "-m", "primus.cli.main", "preflight", "--quick", "--tests", "gemm,membw",
                           "--timeout", "20", "--report-dir", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=90, cwd=tmp_path,
                          env={k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["world"]["world_size"] == 1 and len(report["measurements"]["gemm"]) == 1
    assert any("one rank: no collectives" in f["message"] for f in report["findings"])
    bad = subprocess.run([sys.executable, "-m", "primus.cli.main", "preflight", "--tests", "allgathr"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert bad.returncode == 2 and "did you mean 'allgather'" in bad.stderr


@pytest.mark.e2e
def test_cli_checks_a_wan_experiment(tmp_path):
    """A Wan 2.2 experiment (AutoModel) is planned by preflight's experiment check, not refused."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "primus.cli.main", "preflight",
                           str(root / "examples" / "nemo_automodel" / "wan2_2_tiny-cpu.yaml"), "--quick",
                           "--tests", "gemm", "--timeout", "20", "--report-dir", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**{k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")},
                               "PRIMUS_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    found = [f for f in report["findings"] if f["check"] == "experiment"]
    assert any("parameters per expert" in f["message"] and "tokens/sample" in f["message"] for f in found), found
    assert found[0]["details"]["plan"]["kind"] == "wan"
