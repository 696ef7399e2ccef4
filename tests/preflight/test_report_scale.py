"""The report at the scale of a real job, from synthetic rank data: 512 ranks on 64 MI300X hosts.
Tables show a summary and the outliers, topology and memory bandwidth reach Markdown and PDF, and
devices far below a healthy MI300X are findings even when all their peers are as slow."""
from __future__ import annotations

import re
import zlib

import pytest

from primus.preflight.checks import Context
from primus.preflight.options import PreflightOptions
from primus.preflight.report import build_report
from primus.preflight.report.markdown import render_markdown
from primus.preflight.report.tables import MAX_ROWS
from primus.plan.thresholds import load_thresholds

HOSTS, PER_HOST = 64, 8
TOPOLOGY = "        GPU0   GPU1\nGPU0   0      XGMI\nGPU1   XGMI   0"
SLOW_GEMM = {77: 180_000.0, 300: 150_000.0}  # GFLOP/s: two bad GPUs (healthy: ~650 TFLOP/s)


def _facts(rank: int) -> dict:
    host, local = f"node{rank // PER_HOST:03d}", rank % PER_HOST
    acc = {"available": True, "flavour": "rocm", "count": PER_HOST, "local_device": local, "driver": "6.10",
           "devices": [{"index": i, "name": "AMD Instinct MI300X", "arch": "gfx942", "memory_total": 192 * 2**30}
                       for i in range(PER_HOST)],
           "memory_free": 190 * 2**30, "memory_total": 192 * 2**30}
    if local == 0:
        acc["topology"] = TOPOLOGY
    return {"identity": {"rank": rank, "host": host, "local_rank": local, "device": f"cuda:{local}"},
            "accelerators": acc}


def _result(rank: int) -> dict:
    gflops = SLOW_GEMM.get(rank, 640_000.0 + rank)
    return {"rank": rank, "errors": [], "collectives": {}, "groups": {},
            "gemm": {"dtype": "bfloat16", "n": 8192, "iters": 50, "seconds": 2 * 8192**3 / gflops / 1e9, "gflops": gflops},
            "membw": {"bytes": 2**30, "iters": 20, "seconds": 1.0, "gbps": 2000.0}}  # every HBM slow: power cap?


@pytest.fixture(scope="module")
def report():
    world = HOSTS * PER_HOST
    thresholds = load_thresholds()
    opts = PreflightOptions.from_dict({"quick": False, "report_dir": "unused", "checks": "accelerators",
                                       "timeout": 60})
    facts = {r: _facts(r) for r in range(world)}
    ctx = Context(world, thresholds, {r: f["identity"]["host"] for r, f in facts.items()}, opts.to_dict())
    return build_report(opts, thresholds, ctx, facts, {r: _result(r) for r in range(world)}, [], "cuda")


def _section(markdown: str, title: str) -> str:
    return markdown.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_devices_far_below_a_healthy_mi300x_are_findings(report):
    messages = {f["message"]: f for f in report["findings"] if f["level"] != "info"}
    gemm = next(f for m, f in messages.items() if m.startswith("GEMM far below a healthy MI300X"))
    assert gemm["level"] == "fail" and gemm["ranks"] == [77, 300]  # 180 and 150 of 650 TFLOP/s: under 30%
    hbm = next(f for m, f in messages.items() if m.startswith("memory bandwidth far below a healthy MI300X"))
    assert hbm["level"] == "warn" and hbm["ranks"] == list(range(HOSTS * PER_HOST))  # 2000 of 4200 GB/s
    assert "and 504 more" in hbm["message"]  # one line, not 512
    assert not any("straggler" in m and "memory bandwidth" in m for m in messages)  # peers can't see it


def test_markdown_tables_stay_readable_at_512_ranks(report):
    md = render_markdown(report, {})
    ranks = _section(md, "Ranks")
    assert "512 ranks on 64 hosts; accelerators: 512 x AMD Instinct MI300X" in ranks
    assert len([l for l in ranks.splitlines() if l.startswith("| ") and l[2].isdigit()]) <= MAX_ROWS
    gemm = _section(md, "GEMM")
    rows = [l for l in gemm.splitlines() if l.startswith("| ") and l[2].isdigit()]
    assert "512 ranks: min 150000.0" in gemm and "median" in gemm
    assert rows[0].startswith("| 300 |") and rows[1].startswith("| 77 |")  # slowest first
    assert len(rows) < 20
    membw = _section(md, "Memory bandwidth")
    assert "512 ranks: min 2000.0, p10 2000.0, median 2000.0, max 2000.0 GB/s" in membw
    topo = [title for title in re.findall(r"^## GPU topology: (.*)$", md, re.M)]
    assert topo == ["node000, node001, node002, node003, node004, node005 and 58 more"]  # one topology, once
    assert TOPOLOGY in md


def _pdf_text(path) -> str:
    data = path.read_bytes()
    streams = re.findall(rb"stream\r?\n(.*?)\r?\nendstream", data, re.S)
    text = b"".join(zlib.decompress(s) if s[:1] == b"x" else s for s in streams)
    return b" ".join(re.findall(rb"\((.*?)\) ?Tj", text)).decode("latin-1")


def test_pdf_has_topology_memory_bandwidth_and_summaries(report, tmp_path):
    pytest.importorskip("fpdf")
    from primus.preflight.report.pdf import render_pdf

    render_pdf(report, {}, tmp_path, tmp_path / "report.pdf")
    text = _pdf_text(tmp_path / "report.pdf")
    assert "GPU topology: node000" in text and "XGMI" in text
    assert "Memory bandwidth per rank" in text and "2000.0" in text
    assert "512 ranks on 64 hosts" in text and "512 ranks: min 150000.0" in text
