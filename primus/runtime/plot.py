"""End-of-run PNG of loss (and validation loss) and throughput per step, from metrics.jsonl; with
more than one rank, a heat map of each rank's forward+backward time over the median, per straggler
report."""
from __future__ import annotations

import statistics
from pathlib import Path

from primus.runtime.metrics import is_step_row, read_rows


def rank_heat(events: list[dict], phase: str = "compute") -> tuple[list[list[float]], list[int]]:
    """Per report window (columns) each rank's ``phase`` seconds over the median of the *other*
    ranks, as the straggler line compares them (rows), and each window's last step."""
    columns, ends = [], []
    for event in events:
        values = event.get(phase) or []
        if len(values) < 2:
            continue
        medians = [statistics.median(values[:i] + values[i + 1:]) for i in range(len(values))]
        columns.append([value / median if median > 0 else 1.0 for value, median in zip(values, medians)])
        ends.append(event["steps"][-1])
    rows = [list(row) for row in zip(*columns)] if columns else []
    return rows, ends


def plot_metrics(run_dir: Path) -> Path | None:
    from primus.runtime.rundir import RunDir

    everything = read_rows(RunDir(run_dir).metrics, kind=None)
    rows = [r for r in everything if is_step_row(r)]
    evals = [r for r in everything if r.get("kind") == "eval" and r.get("name", "valid") == "valid"]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heat, ends = rank_heat([r for r in everything if r.get("event") == "ranks"])
    panels = 3 if heat else 2
    fig, axes = plt.subplots(panels, 1, figsize=(7, 3 * panels))
    loss_ax, speed_ax = axes[0], axes[1]
    steps = [r["step"] for r in rows]
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
    if heat:
        heat_ax = axes[2]
        image = heat_ax.imshow(heat, aspect="auto", cmap="magma_r", vmin=0.5, vmax=max(2.0, max(map(max, heat))),
                               interpolation="nearest")
        every = max(1, len(ends) // 12)
        heat_ax.set_xticks(range(0, len(ends), every), [str(end) for end in ends[::every]])
        heat_ax.set_xlabel("straggler report (last step)")
        heat_ax.set_ylabel("rank")
        if len(heat) <= 32:
            heat_ax.set_yticks(range(len(heat)))
        heat_ax.set_title("forward+backward time / median of the other ranks", fontsize=9)
        fig.colorbar(image, ax=heat_ax)
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    out = run_dir / "metrics.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
