"""One figure from the suite's results: A/B step times, CLI latency, operating points."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(results: dict[str, Any], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    panels = [k for k in ("overhead", "cli", "knobs", "checkpoint", "precision") if k in results]
    if not panels:
        return None
    ncols = min(3, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.5 * ncols, 4.2 * nrows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, panels):
        r = results[name]
        if name == "overhead":
            labels, a_vals, b_vals = [], [], []
            for backend in ("torchtitan", "megatron", "nemo_automodel"):
                if backend in r and r[backend]["step_time_primus_s"]["median"]:
                    labels.append(backend)
                    a_vals.append([p["step_time_median_s"] for p in r[backend]["primus"] if p["step_time_median_s"]])
                    b_vals.append([p["step_time_median_s"] for p in r[backend]["bare"] if p["step_time_median_s"]])
            for i, (a, b) in enumerate(zip(a_vals, b_vals)):
                base = sorted(b)[len(b) // 2]
                ax.scatter([i - 0.1] * len(a), [v / base for v in a], color="C0", label="primus" if i == 0 else None)
                ax.scatter([i + 0.1] * len(b), [v / base for v in b], color="C1", label="bare" if i == 0 else None)
            ax.axhline(1.01, ls="--", color="grey", lw=0.8)
            ax.set_xticks(range(len(labels)), labels)
            ax.set_ylabel("run median step time / bare median")
            ax.set_title("Overhead: each dot one run")
            ax.legend()
        elif name == "cli":
            names = list(r["commands"])
            vals = [r["commands"][n]["wall_s"]["median"] for n in names]
            ax.barh(range(len(names)), vals, color="C2")
            ax.set_yticks(range(len(names)), [n.replace(" EXP", "\nEXP") for n in names], fontsize=8)
            ax.axvline(vals[0] + 0.3, ls="--", color="grey", lw=0.8, label="interpreter + 0.3 s")
            ax.set_xlabel("median wall time (s)")
            ax.set_title("CLI latency")
            ax.legend(fontsize=8)
        elif name == "checkpoint":
            cases = r["cases"]
            y = range(len(cases))
            ax.barh([i - 0.2 for i in y], [c["ratio"] or 0 for c in cases], height=0.4, color="C0", label="Primus")
            ax.barh([i + 0.2 for i in y], [c.get("ratio_upstream") or 0 for c in cases], height=0.4, color="C3",
                    label="bare engine, no fix")
            ax.axvline(r["target"], ls="--", color="grey", lw=0.8, label=f"target {r['target']}")
            ax.set_yticks(list(y), [c["case"] for c in cases], fontsize=8)
            ax.set_xlabel("steady step after 1st checkpoint / checkpoints off")
            ax.set_title("Checkpoint slowdown")
            ax.legend(fontsize=8)
        elif name == "precision":
            cases = r["cases"]
            ax.bar(range(len(cases)), [c["speedup_bf16"] or 0 for c in cases], color="C4")
            ax.axhline(1.0, color="grey", lw=0.8)
            ax.axhline(r["target"], ls="--", color="grey", lw=0.8, label=f"target {r['target']}×")
            ax.set_xticks(range(len(cases)), [c["backend"] + ("" if c["bf16_native"] else "\n(emulated)")
                                              for c in cases], fontsize=8)
            ax.set_ylabel("bf16 throughput / fp32")
            ax.set_title("bf16 on CPU")
            ax.legend(fontsize=8)
        else:
            pts = r.get("torchtitan", [])
            names = [p["name"].split(":")[0] if i == 0 else p["name"] for i, p in enumerate(pts)]
            thr = [p.get("throughput_vs_baseline") or 0 for p in pts]
            mem = [p.get("memory_vs_baseline") or 0 for p in pts]
            y = range(len(pts))
            ax.barh([i - 0.2 for i in y], thr, height=0.4, label="throughput ×", color="C0")
            ax.barh([i + 0.2 for i in y], mem, height=0.4, label="peak RSS ×", color="C3")
            ax.set_yticks(list(y), names, fontsize=7)
            ax.axvline(1.0, color="grey", lw=0.8)
            ax.set_title("TorchTitan operating points vs baseline")
            ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
