"""Primus vs. the bare engine: same model, data and native config; A/B runs interleaved (ABBA...).

Step time, both sides: ``benchmarks/probe`` (torch's global optimizer step post-hook) timestamps
the end of every optimizer step in the training process; a step time is the interval between
two consecutive step ends, i.e. the full loop iteration (data, forward, backward, optimizer,
the engine's logging and, for Primus, its metrics/TensorBoard/log files). The first ``skip``
steps are dropped (lazy init, allocator warm-up). Time to first step: from the harness starting
the process to the end of optimizer step 1 (wall clock), so Primus's CLI, config resolution,
validation and run-directory work all count.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import (AM_ASSETS, AM_SMALL_ASSETS, CONFIGS, PRIMUS, PY, REPO, SMALL_WAN, TT_ASSETS, fmt,
                               md_table, median, run_probed, spread)

PRESET = CONFIGS / "presets" / "llama_25m.yaml"


def _order(reps: int) -> list[str]:
    """ABBA ABBA ...: linear drift in machine load cancels in the A/B medians."""
    pattern = ["A", "B", "B", "A"]
    return [pattern[i % 4] for i in range(2 * reps)]


def torchtitan_cmds(ws: Path, i: int, steps: int, batch: int, seq: int, extra: list[str] | None = None):
    primus = [PRIMUS, "train", str(CONFIGS / "torchtitan_llama_25m.yaml"), f"workspace={ws}", f"exp_name=primus_{i}",
              f"training.steps={steps}", f"training.local_batch_size={batch}", f"training.seq_len={seq}",
              *(extra or [])]
    bare = [PY, "-m", "benchmarks.bare.torchtitan_bare", "--preset", str(PRESET), "--assets", str(TT_ASSETS),
            "--dump", str(ws / f"bare_{i}"), "--steps", str(steps), "--batch", str(batch), "--seq", str(seq)]
    return primus, bare, ws / "bench" / "bench" / f"primus_{i}"


def automodel_cmds(ws: Path, i: int, steps: int, small: bool = True):
    """``small``: the wider Wan experts (compute-bound steps); else the 20 ms dispatch-bound tiny demo."""
    config, assets = ("automodel_wan_small.yaml", AM_SMALL_ASSETS) if small else ("automodel_wan_tiny.yaml", AM_ASSETS)
    primus = [PRIMUS, "train", str(CONFIGS / config), f"workspace={ws}", f"exp_name=primus_{i}",
              f"step_scheduler.max_steps={steps}"]
    bare = [PY, "-m", "benchmarks.bare.automodel_bare", "--assets", str(assets), "--run-dir",
            str(ws / f"bare_{i}"), "--set", f"step_scheduler.max_steps={steps}"]
    return primus, bare, ws / "bench" / "bench" / f"primus_{i}"


def build_small_wan_assets() -> None:
    """The small Wan's pipeline and latent cache, built once before any timed run (fresh interpreter)."""
    code = ("import sys; from pathlib import Path; from primus.data.diffusion.tiny import build_tiny_assets; "
            f"build_tiny_assets(Path(sys.argv[1]), transformer={SMALL_WAN!r})")
    subprocess.run([PY, "-c", code, str(AM_SMALL_ASSETS)], cwd=REPO, check=True, capture_output=True, timeout=600)


def megatron_cmds(ws: Path, i: int, steps: int, batch: int, seq: int):
    """Primus on megatron_llama_25m.yaml vs benchmarks/bare/megatron_bare.py (1 rank, no accumulation)."""
    primus = [PRIMUS, "train", str(CONFIGS / "megatron_llama_25m.yaml"), f"workspace={ws}", f"exp_name=primus_{i}",
              f"train_iters={steps}", f"micro_batch_size={batch}", f"global_batch_size={batch}", f"seq_length={seq}"]
    bare = [PY, "-m", "benchmarks.bare.megatron_bare", "--preset", str(PRESET), "--assets", str(TT_ASSETS),
            "--dump", str(ws / f"bare_{i}"), "--steps", str(steps), "--batch", str(batch), "--seq", str(seq)]
    return primus, bare, ws / "bench" / "bench" / f"primus_{i}"


def megatron_ready() -> bool:
    """Whether the Megatron backend's example validates (benchmarks.backends includes Megatron then)."""
    example = REPO / "examples" / "megatron" / "llama3_tiny-pretrain.yaml"
    if not example.exists():
        return False
    proc = subprocess.run([PRIMUS, "config", "validate", str(example)], cwd=REPO, capture_output=True, timeout=300)
    return proc.returncode == 0


def parity(backend: str, run_dir: Path, bare_cmd: list[str]) -> dict[str, Any]:
    """Both sides get the identical native config (checked on the built config objects)."""
    argv = bare_cmd[3:]  # drop "python -m benchmarks.bare.X"
    proc = subprocess.run([PY, "-m", "benchmarks.parity", backend, str(run_dir), *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"equal": None, "error": proc.stderr[-2000:]}


def measure(backend: str, *, reps: int, steps: int, skip: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    ws = Path(tempfile.mkdtemp(prefix=f"primus-bench-{backend}-"))
    runs: dict[str, list] = {"A": [], "B": []}
    check: dict[str, Any] | None = None
    try:
        for i, side in enumerate(_order(reps)):
            if backend == "torchtitan":
                primus, bare, run_dir = torchtitan_cmds(ws, i, steps, 2, 256)
            elif backend == "megatron":
                primus, bare, run_dir = megatron_cmds(ws, i, steps, 2, 256)
            else:
                primus, bare, run_dir = automodel_cmds(ws, i, steps)
            cmd = primus if side == "A" else bare
            run = run_probed(f"{backend}:{'primus' if side == 'A' else 'bare'}#{i}", cmd, env=env, verbose=True)
            runs[side].append(run)
            if side == "A" and check is None and run.rc == 0:
                check = parity(backend, run_dir, bare)
                print(f"    config parity ({backend}): {'identical' if check.get('equal') else check}", flush=True)
    finally:
        shutil.rmtree(ws, ignore_errors=True)
    a_meds = [median(r.step_times(skip)) for r in runs["A"] if r.rc == 0 and r.step_times(skip)]
    b_meds = [median(r.step_times(skip)) for r in runs["B"] if r.rc == 0 and r.step_times(skip)]
    a_first = [r.first_step_s for r in runs["A"] if r.first_step_s is not None]
    b_first = [r.first_step_s for r in runs["B"] if r.first_step_s is not None]
    # pairwise ratios in run order (A_i with its neighbouring B): their spread is the noise floor
    pairs = [(a, b) for a, b in zip(a_meds, b_meds)]
    ratio = (median(a_meds) / median(b_meds)) if a_meds and b_meds else None
    first_delta = (median(a_first) - median(b_first)) if a_first and b_first else None
    return {
        "backend": backend, "reps": reps, "steps": steps, "skip": skip, "config_parity": check,
        "primus": [r.summary(skip) for r in runs["A"]], "bare": [r.summary(skip) for r in runs["B"]],
        "step_time_primus_s": spread(a_meds), "step_time_bare_s": spread(b_meds),
        "ratio": ratio, "pair_ratios": [a / b for a, b in pairs], "pair_ratio_spread": spread([a / b for a, b in pairs]),
        "first_step_primus_s": spread(a_first), "first_step_bare_s": spread(b_first),
        "first_step_overhead_s": first_delta,
        "target_ratio_met": ratio is not None and ratio <= 1.01,
        "target_first_step_met": first_delta is not None and first_delta <= 1.0,
    }


def hotpath() -> dict[str, Any]:
    proc = subprocess.run([PY, "-m", "benchmarks.hotpath"], cwd=REPO, capture_output=True, text=True, timeout=300)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": proc.stderr[-2000:]}


def run(quick: bool, threads: int = 1) -> dict[str, Any]:
    """``threads``: OMP_NUM_THREADS for both sides (0 = torch's default). One thread per run keeps
    the A/B ratio readable on a shared 2-core machine, where a 2-thread GEMM stalls whenever a
    neighbour's process takes one of the cores; the overhead is Python-side, so it shows either way."""
    env = {"OMP_NUM_THREADS": str(threads)} if threads else None
    results: dict[str, Any] = {"hotpath_us": hotpath(), "threads": threads or "torch default"}
    print(f"  primus per-step hot path: {results['hotpath_us']}", flush=True)
    results["torchtitan"] = measure("torchtitan", reps=1 if quick else 2, steps=8 if quick else 12, skip=2, env=env)
    build_small_wan_assets()
    results["nemo_automodel"] = measure("nemo_automodel", reps=2 if quick else 3, steps=15 if quick else 25, skip=3,
                                        env=env)
    # megatron-core has no trainer (no megatron.training in the wheel): the bare side is
    # benchmarks/bare/megatron_bare.py, a Megatron-LM-style loop over core's public API.
    results["megatron"] = measure("megatron", reps=1 if quick else 2, steps=8 if quick else 12, skip=2, env=env)
    return results


def markdown(results: dict[str, Any]) -> str:
    rows = []
    for backend in ("torchtitan", "megatron", "nemo_automodel"):
        r = results.get(backend)
        if not r or "ratio" not in r:
            continue
        a, b, pr = r["step_time_primus_s"], r["step_time_bare_s"], r["pair_ratio_spread"]
        rows.append([backend, fmt(a["median"], ".4f"), fmt(b["median"], ".4f"),
                     f"**{fmt(r['ratio'], '.3f')}** ({fmt(pr['min'], '.3f')}–{fmt(pr['max'], '.3f')})",
                     "yes" if r["target_ratio_met"] else "no",
                     fmt(r["first_step_primus_s"]["median"], ".2f"), fmt(r["first_step_bare_s"]["median"], ".2f"),
                     f"**{fmt(r['first_step_overhead_s'], '+.2f')}**", "yes" if r["target_first_step_met"] else "no",
                     "identical" if (r.get("config_parity") or {}).get("equal") else "DIFFERENT/unchecked"])
    table = md_table(["backend", "step primus (s)", "step bare (s)", "ratio A/B (pair range)", "≤1.01",
                      "1st step primus (s)", "1st step bare (s)", "Δ first step (s)", "≤1 s", "native config"], rows)
    hp = results.get("hotpath_us", {})
    extra = (f"\n\nPrimus per-step cost (isolated, µs/step): report_step {hp.get('report_us')}, of which "
             f"TensorBoard {hp.get('tensorboard_us')}, `[TRAIN]` log record {hp.get('log_record_us')}, derive "
             f"{hp.get('derive_us')}. Runs used OMP_NUM_THREADS={results.get('threads')}. Megatron's bare side is a "
             f"Megatron-LM-style loop over megatron-core (benchmarks/bare/megatron_bare.py): the wheel ships no trainer.")
    return table + extra
