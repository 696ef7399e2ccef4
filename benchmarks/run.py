"""Run the Primus benchmark suite; JSON per benchmark in benchmarks/results/, a Markdown summary, a plot.

    .venv/bin/python -m benchmarks.run                 # full suite, ~20 min on 2 CPU cores
    .venv/bin/python -m benchmarks.run --quick         # a few minutes
    .venv/bin/python -m benchmarks.run --only overhead,cli

Benchmarks: cli, overhead, roofline, backends, knobs, checkpoint, async_checkpoint, precision, compile, instruments,
plan_memory. Not part of the test suite's pass/fail:
targets are reported (met / not met), never asserted.
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Any

import yaml

from benchmarks import (async_checkpoint, backends, checkpoint_steady, cli_latency, common, instruments, knobs, overhead,
                        plan_memory, precision, roofline, torch_compile)

ORDER = ("cli", "overhead", "roofline", "backends", "knobs", "checkpoint", "async_checkpoint", "precision", "compile",
         "instruments", "plan_memory")
PRESET = common.CONFIGS / "presets" / "llama_25m.yaml"


def _achieved(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Achieved TFLOP/s per backend (and dtype) on the 25M preset, from the Primus runs of this suite."""
    from primus.plan.flops import flops_per_token
    from primus.plan.model import ModelSpec

    spec = ModelSpec(**yaml.safe_load(PRESET.read_text())["model"])
    seq, batch = 256, 2
    fpt = flops_per_token(spec, seq)  # the one convention (Megatron-LM's num_floating_point_operations)
    out = {}
    model = f"llama_25m ({spec.total_params() / 1e6:.1f}M params, seq {seq}, global bs {batch})"
    precision_cases = {c["backend"]: c for c in (results.get("precision") or {}).get("cases", [])}
    for backend in ("torchtitan", "megatron"):
        step, note = None, ""
        points = [p for p in (results.get("backends") or {}).get("points", []) if p["backend"] == backend]
        if points and points[0]["step_time_s"]:
            step, note = points[0]["step_time_s"], "fp32, primus train, 1 rank, torch default threads"
        elif backend in precision_cases:
            step, note = precision_cases[backend]["step_time_s"]["fp32"], "fp32, precision runs"
        elif backend == "torchtitan" and "overhead" in results:
            step = results["overhead"]["torchtitan"]["step_time_primus_s"]["median"]
            note = f"fp32, overhead runs (OMP_NUM_THREADS={results['overhead'].get('threads')})"
        rows = [(backend, step, note)]
        if backend in precision_cases:
            case = precision_cases[backend]
            rows.append((f"{backend} bf16", case["step_time_s"]["bf16"],
                         "bf16, precision runs" + ("" if case["bf16_native"] else " (forced: no bf16 units, emulated)")))
        for name, step, note in rows:
            if step:
                tps = batch * seq / step
                out[name] = {"model": model, "flops_per_token": fpt, "tokens_per_s": tps, "tflops": fpt * tps / 1e12,
                             "note": note}
            else:
                out[name] = {"model": model, "tflops": None, "note": "not run (run --only backends,roofline)"}
    out["nemo_automodel"] = {"model": "tiny Wan 2.2 (diffusion)", "tflops": None,
                             "note": "no FLOPs formula for diffusion transformers in Primus (tflops=n/a)"}
    return out


def summary_markdown(results: dict[str, Any], meta: dict[str, Any]) -> str:
    m = meta["machine"]
    parts = [f"# Primus benchmarks ({'quick' if meta['quick'] else 'full'})",
             f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['torch_threads']} threads), "
             f"Python {m['python']}; load average at start {tuple(round(x, 2) for x in m['loadavg_at_start'])}; "
             f"{m['time']}; total {meta['total_s']:.0f} s. Command: `{meta['command']}`"]
    titles = {"cli": "CLI latency", "overhead": "Overhead vs. the bare engine", "roofline": "Machine roofline",
              "backends": "Backend comparison (25M Llama preset)", "knobs": "Operating points",
              "checkpoint": "Steady step time after the first checkpoint / checkpoints off",
              "async_checkpoint": "The step after a save: asynchronous vs synchronous checkpoints",
              "precision": "bf16 vs fp32 on CPU", "compile": "torch.compile on CPU",
              "instruments": "Per-rank instruments on vs off (straggler report, watchdog, flight recorder)",
              "plan_memory": "Plan vs measured memory per rank; the fake-world build"}
    modules = {"cli": cli_latency, "overhead": overhead, "roofline": roofline, "backends": backends, "knobs": knobs,
               "checkpoint": checkpoint_steady, "async_checkpoint": async_checkpoint, "precision": precision,
               "compile": torch_compile, "instruments": instruments, "plan_memory": plan_memory}
    for name in ORDER:
        if name in results:
            parts.append(f"## {titles[name]}\n\n{modules[name].markdown(results[name])}")
    return "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and steps (a few minutes)")
    parser.add_argument("--only", help=f"comma list of: {','.join(ORDER)}")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--overhead-threads", type=int, default=1,
                        help="OMP_NUM_THREADS of the A/B overhead runs (0 = torch default; default 1)")
    args = parser.parse_args(argv)
    chosen = [n.strip() for n in args.only.split(",")] if args.only else list(ORDER)
    unknown = [n for n in chosen if n not in ORDER]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {','.join(ORDER)}")
    meta = {"quick": args.quick, "machine": common.machine(),
            "command": "python -m benchmarks.run" + (" --quick" if args.quick else "")
            + (f" --only {args.only}" if args.only else "")}
    results: dict[str, Any] = {}
    start = time.perf_counter()
    for name in ORDER:
        if name not in chosen:
            continue
        t = time.perf_counter()
        print(f"== {name}", flush=True)
        if name == "cli":
            results[name] = cli_latency.run(args.quick)
        elif name == "overhead":
            results[name] = overhead.run(args.quick, threads=args.overhead_threads)
        elif name == "roofline":
            results[name] = roofline.run(args.quick, achieved=None)
        elif name == "backends":
            results[name] = backends.run(args.quick)
        elif name == "knobs":
            results[name] = knobs.run(args.quick)
        elif name == "checkpoint":
            results[name] = checkpoint_steady.run(args.quick)
        elif name == "async_checkpoint":
            results[name] = async_checkpoint.run(args.quick)
        elif name == "precision":
            results[name] = precision.run(args.quick)
        elif name == "compile":
            results[name] = torch_compile.run(args.quick)
        elif name == "instruments":
            results[name] = instruments.run(args.quick)
        elif name == "plan_memory":
            results[name] = plan_memory.run(args.quick)
        results[name]["elapsed_s"] = time.perf_counter() - t
        print(f"   {name}: {results[name]['elapsed_s']:.0f} s", flush=True)
    if "roofline" in results:  # achieved numbers come from the training runs, whichever ran
        # MFU against the device peak (fastest native dtype's best GEMM in this run, sweep or preflight):
        # on a shared box a loaded moment only ever lowers a measurement, so the best one is the capability.
        rl = results["roofline"]
        fp32_peak = max(rl["peak_gflops_fp32"], rl["preflight_gemm_gflops"]["max"] or 0)
        peak = max(fp32_peak, rl["peak_gflops_bf16"]) if rl["bf16_native"] else fp32_peak
        rl["peak_gflops_for_mfu"] = peak
        for backend, a in _achieved(results).items():
            if a.get("tflops") is not None:
                a["mfu_vs_measured_peak"] = a["tflops"] * 1e3 / peak
                a["mfu_vs_fp32_peak"] = a["tflops"] * 1e3 / fp32_peak
            results["roofline"]["achieved"][backend] = a
    meta["total_s"] = time.perf_counter() - start
    for name, data in results.items():
        common.save(name, {"meta": meta, "results": data})
    summary = summary_markdown(results, meta)
    (common.RESULTS / "summary.md").write_text(summary)
    (common.RESULTS / "all.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2, default=str))
    if not args.no_plot:
        from benchmarks.plot import plot

        path = plot(results, common.RESULTS / "benchmarks.png")
        if path:
            print(f"plot: {path}")
    print(summary)
    print(f"results: {common.RESULTS}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
