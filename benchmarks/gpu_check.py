"""The CUDA/ROCm path, run end to end on one GPU: what CI (CPU-only) can never execute.

    python -m benchmarks.gpu_check --out DIR [--budget-s 420]

Steps, each a subprocess with its own timeout, logged to ``DIR/<step>.log`` and summarised in
``DIR/gpu_check.json`` after every step (a run cut short still leaves its results):

  env         torch / CUDA / device facts
  tt_tiny     the README's TorchTitan example through ``primus train`` on the GPU (fp32 params)
  tt_bf16     the same with ``training.mixed_precision_param=bfloat16`` (FSDP2 MixedPrecisionPolicy)
  mg_tiny     the Megatron example through ``primus train`` on the GPU (bf16)
  tt_float8   the TorchTitan float8 example (rowwise, torchao on the FP8 units; bf16 params)
  mg_fp8      the Megatron example in FP8 (hybrid, tensorwise) on Transformer Engine's layers; without
              Transformer Engine on the host, the one-line admission refusal is the result
  am_tiny     the tiny Wan 2.2 example through NeMo AutoModel on the GPU (bf16)
  moe_*       every tiny MoE example (``examples/*/*tiny*moe*.yaml``, found when the script runs), bf16
  preflight   ``primus preflight`` (accelerator checks, GEMM, memory bandwidth, NCCL at world 1)
  ckpt_steady steady step after the first checkpoint / checkpoints off, TorchTitan tiny demo
              (``benchmarks.checkpoint_steady``, one repetition)
  overhead_*  Primus vs the bare engine (``benchmarks.overhead.measure``) on the GPU, where steps
              are milliseconds and any per-step cost of Primus shows
Steps run in that order and stop being started once ``--budget-s`` is spent.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import PRIMUS, PY, REPO

ENV_PROBE = """
import json, torch
p = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
                  "available": torch.cuda.is_available(), "device": p.name if p else None,
                  "memory_gib": round(p.total_memory / 2**30, 1) if p else None,
                  "nccl": ".".join(map(str, torch.cuda.nccl.version())) if p else None}))
"""

OVERHEAD = """
import json, sys
from benchmarks import overhead
r = overhead.measure(sys.argv[1], reps=int(sys.argv[2]), steps=int(sys.argv[3]), skip=int(sys.argv[4]))
print(json.dumps({k: r[k] for k in ("ratio", "pair_ratios", "step_time_primus_s", "step_time_bare_s",
                  "first_step_overhead_s", "first_step_primus_s", "first_step_bare_s", "config_parity")}, default=str))
"""


CHECKPOINT = """
import json
from benchmarks import checkpoint_steady as c
cases = c._cases(30, 10)
r = c.measure("torchtitan tiny demo", cases["torchtitan tiny demo"], reps=1, steps=30, interval=10)
print(json.dumps({k: r[k] for k in ("ratio", "ratio_upstream", "on", "off", "bare_on", "bare_off")}, default=str))
"""

# bf16 keys per backend, for the MoE examples whoever adds them
BF16 = {"torchtitan": ["training.mixed_precision_param=bfloat16"], "megatron": ["bf16=true"],
        "nemo_automodel": ["model.compute_dtype=bfloat16"]}
STEPS = {"torchtitan": "training.steps=20", "megatron": "train_iters=20", "nemo_automodel": "step_scheduler.max_steps=20"}


def moe_examples() -> list[Path]:
    return sorted(REPO.glob("examples/*/*tiny*moe*.yaml"))


def _last_json(text: str) -> Any:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def _train_summary(workspace: Path, exp_name: str) -> dict[str, Any]:
    """First/last loss and median step throughput from the run's metrics.jsonl."""
    files = sorted(workspace.rglob(f"{exp_name}/metrics.jsonl"))
    if not files:
        return {}
    from primus.runtime.metrics import read_rows

    rows = read_rows(files[-1])  # step rows only
    steady = rows[2:] or rows
    if not steady:
        return {"steps": 0}
    mid = sorted(r["step_time"] for r in steady)[len(steady) // 2]
    tokens = sorted(r["tokens_per_sec"] or 0 for r in steady)[len(steady) // 2]
    mfu = [r["mfu"] for r in steady if r.get("mfu") is not None]
    return {"steps": len(rows), "loss_first": rows[0]["loss"], "loss_last": rows[-1]["loss"],
            "step_time_median_s": mid, "tokens_per_sec_median": tokens,
            "mfu_median": sorted(mfu)[len(mfu) // 2] if mfu else None, "mem_gb": rows[-1].get("mem_gb")}


def steps(out: Path) -> list[tuple[str, list[str], int]]:
    ws = out / "workspace"
    moe = []
    for example in moe_examples():
        backend = example.parent.name
        name = f"moe_{backend}_{example.stem}".replace("-", "_").replace(".", "_")
        moe.append((name, [PRIMUS, "train", str(example.relative_to(REPO)), f"workspace={ws}", f"exp_name={name}",
                           STEPS.get(backend, "training.steps=20"), *BF16.get(backend, [])], 240))
    return [
        ("env", [PY, "-c", ENV_PROBE], 60),
        ("nvidia_smi", ["nvidia-smi"], 30),
        ("tt_tiny", [PRIMUS, "train", "examples/torchtitan/llama3_tiny-pretrain.yaml", f"workspace={ws}",
                     "exp_name=tt_tiny", "training.steps=40", "training.mixed_precision_param=float32"], 240),
        ("tt_bf16", [PRIMUS, "train", "examples/torchtitan/llama3_tiny-pretrain.yaml", f"workspace={ws}",
                     "exp_name=tt_bf16", "training.steps=40", "training.mixed_precision_param=bfloat16"], 240),
        ("mg_tiny", [PRIMUS, "train", "examples/megatron/llama3_tiny-pretrain.yaml", f"workspace={ws}",
                     "exp_name=mg_tiny", "bf16=true", "train_iters=40"], 240),
        ("tt_float8", [PRIMUS, "train", "examples/torchtitan/llama3_tiny-float8.yaml", f"workspace={ws}",
                       "exp_name=tt_float8", "training.mixed_precision_param=bfloat16"], 240),
        ("mg_fp8", [PRIMUS, "train", "examples/megatron/llama3_tiny-pretrain.yaml", f"workspace={ws}",
                    "exp_name=mg_fp8", "bf16=true", "train_iters=40", "fp8=hybrid", "fp8_recipe=tensorwise"], 240),
        ("am_tiny", [PRIMUS, "train", "examples/nemo_automodel/wan2_2_tiny-cpu.yaml", f"workspace={ws}",
                     "exp_name=am_tiny", "model.compute_dtype=bfloat16", "step_scheduler.max_steps=20",
                     "step_scheduler.num_epochs=10", "fsdp.reduce_dtype=bfloat16"], 240),
        *moe,
        ("preflight", [PRIMUS, "preflight", "--report-dir", str(out / "preflight")], 150),
        ("ckpt_steady", [PY, "-c", CHECKPOINT], 300),
        ("overhead_torchtitan", [PY, "-c", OVERHEAD, "torchtitan", "2", "40", "5"], 300),
        ("overhead_megatron", [PY, "-c", OVERHEAD, "megatron", "2", "40", "5"], 300),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=420, help="start no step after this many seconds")
    parser.add_argument("--only", default="", help="comma-separated step names")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    only = {s for s in args.only.split(",") if s}
    results: dict[str, Any] = {}
    start = time.monotonic()
    for name, cmd, timeout in steps(args.out.resolve()):
        if only and name not in only:
            continue
        left = args.budget_s - (time.monotonic() - start)
        if left < 20:
            results[name] = {"skipped": f"budget spent ({args.budget_s:.0f} s)"}
            continue
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=min(timeout, left))
            rc, text = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc, text = 124, f"{(exc.stdout or b'').decode(errors='replace') if isinstance(exc.stdout, bytes) else exc.stdout or ''}\nTIMEOUT"
        (args.out / f"{name}.log").write_text(text)
        entry: dict[str, Any] = {"rc": rc, "seconds": round(time.monotonic() - t0, 1)}
        parsed = _last_json(text)
        if parsed is not None:
            entry["result"] = parsed
        if name in ("tt_tiny", "tt_bf16", "mg_tiny", "am_tiny") or name.startswith("moe_"):
            entry["train"] = _train_summary(args.out / "workspace", name)
        if rc != 0:
            entry["tail"] = text[-1500:]
        results[name] = entry
        print(f"[gpu_check] {name}: rc={rc} in {entry['seconds']} s", flush=True)
        (args.out / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str))
    return 0 if all(r.get("rc", 0) == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
