"""Matplotlib figures for the report: busbw against message size, GEMM per rank."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def render_plots(report: dict[str, Any], out_dir: Path) -> dict[str, str]:
    """PNG file names (relative to ``out_dir``) by figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    images: dict[str, str] = {}
    m = report["measurements"]
    if m["collectives"]:
        fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
        series: dict[str, list[tuple[int, float]]] = {}
        for row in m["collectives"]:
            series.setdefault(f"{row['op']} ({row['group']})", []).append((row["size"], row["busbw_gbps"]))
        for label, points in sorted(series.items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title("Bus bandwidth vs message size")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / "busbw.png")
        plt.close(fig)
        images["busbw"] = "busbw.png"
    if m["gemm"]:
        fig, ax = plt.subplots(figsize=(7, 3.5), dpi=110)
        if len(m["gemm"]) <= 32:
            labels = [f"r{g['rank']}\n{g['host']}" for g in m["gemm"]]
            ax.bar(range(len(labels)), [g["gflops"] for g in m["gemm"]], color="tab:blue")
            ax.set_xticks(range(len(labels)), labels, fontsize=7)
        else:  # hundreds of ranks: every rank a thin bar, in rank order; slow ones stand out
            ax.bar(range(len(m["gemm"])), [g["gflops"] for g in m["gemm"]], color="tab:blue", width=1.0)
            ax.set_xlabel("rank")
        ax.set_ylabel("GFLOP/s")
        ax.set_title(f"GEMM per rank ({m['gemm'][0]['dtype']}, n={m['gemm'][0]['n']})")
        fig.tight_layout()
        fig.savefig(out_dir / "gemm.png")
        plt.close(fig)
        images["gemm"] = "gemm.png"
    return images
