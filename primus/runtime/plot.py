"""End-of-run PNG of loss (and validation loss) and throughput per step, from metrics.jsonl."""
from __future__ import annotations

from pathlib import Path

from primus.runtime.metrics import read_rows


def plot_metrics(run_dir: Path) -> Path | None:
    from primus.runtime.rundir import RunDir

    path = RunDir(run_dir).metrics
    rows = read_rows(path)
    evals = [r for r in read_rows(path, "eval") if r.get("name", "valid") == "valid"]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, (loss_ax, speed_ax) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    loss_ax.plot(steps, [r["loss"] for r in rows], marker="o", markersize=3, label="train")
    if evals:
        loss_ax.plot([r["step"] for r in evals], [r["loss"] for r in evals], marker="s", markersize=4,
                     color="tab:orange", label="validation")
        loss_ax.legend()
    loss_ax.set_ylabel("loss")
    loss_ax.grid(alpha=0.3)
    use_tokens = all(r.get("tokens_per_sec") for r in rows)
    speed = [r["tokens_per_sec"] if use_tokens else r["samples_per_sec"] for r in rows]
    speed_ax.plot(steps, speed, marker="o", markersize=3, color="tab:green")
    speed_ax.set_ylabel("tokens/s" if use_tokens else "samples/s")
    speed_ax.set_xlabel("step")
    speed_ax.grid(alpha=0.3)
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    out = run_dir / "metrics.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
