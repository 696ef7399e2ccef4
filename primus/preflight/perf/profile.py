"""The ``local`` device profile: this host measured, for ``primus plan --project --device local``.

Rank 0 of ``primus preflight`` writes it once every rank has reported (the other ranks are idle by
then, so its probes have the host to themselves): GEMM peak at each intra-op thread count (CPU ranks
share the cores), memory bandwidth, fused-attention (SDPA) rate, an MoE's grouped expert GEMM rate per
dtype, the GEMM rate of a training step's linears (the GEMM efficiency), one AdamW step per parameter
(torch's for-loop and foreach implementations), the cost of one tiny kernel, a reference training step
against its projection (the compute efficiency, ``reference_step``), and the link latency and bandwidth
from the run's all-reduce sweep. On a GPU the accelerator's vendor profile is the base and the measured
numbers replace its peaks (the efficiencies then apply to measured peaks: GEMM efficiency 1.0, since the
probe is the achievable rate).
"""
from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any

from primus.plan.profiles import PROFILES, DeviceProfile, Efficiency, write_local_profile

# A CPU has no vendor model: kernels reach what the probes measured (GEMM: the rate of a training step's
# chain of linears over the square probe's, measured); eager PyTorch runs a norm or an activation as several
# passes over memory (UNFUSED_TRAFFIC in primus.plan.projection).
CPU_EFFICIENCY = dict(gemm=1.0, gemm_fp8=1.0, hbm=1.0, intra_link=1.0, inter_link=1.0)
DEFAULT_LINK = (2.0, 100e-6)  # GB/s and seconds for gloo over loopback, when no all-reduce was measured


def _seconds(fn, iters: int, sync=lambda: None) -> float:
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) / iters


def attention_tflops(device: str, dtype, iters: int = 5) -> float:
    """Causal SDPA forward + backward at a training-like shape, model FLOPs (3.5 x forward) per second."""
    import torch
    import torch.nn.functional as F

    gpu = device.startswith("cuda")
    b, heads, s, d = (4, 32, 4096, 128) if gpu else (2, 8, 256, 64)
    q, k, v = (torch.randn(b, heads, s, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    sync = torch.cuda.synchronize if gpu else (lambda: None)

    def step():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.sum().backward()
    seconds = _seconds(step, iters, sync)
    forward = 4 * b * heads * s * s * d / 2
    return 3.5 * forward / seconds / 1e12


def kernel_overhead_s(iters: int = 500) -> float:
    import torch

    a, b = torch.ones(1), torch.ones(1)
    return _seconds(lambda: torch.add(a, b), iters)


OPTIMIZER_LAYERS = 4  # the probe's model: four transformer layers' tensors, ~14M parameters


def optimizer_s_per_param(budget_s: float = 1.0, implementation: str = "for-loop") -> float:
    """Best-of seconds per parameter of one eager AdamW step as ``implementation`` runs it (torch's
    ``for-loop``, one tensor at a time, Megatron's on a CPU; ``foreach``, each op over the whole list with
    temporaries of all of it, TorchTitan's) over ~14M parameters: a model's worth, larger than a CPU's
    caches, as a real model's tensors are (a one-layer probe ran ~30% faster per parameter)."""
    import torch

    from primus.plan.devices import best_seconds

    shapes = [(1536, 512), (1536, 512), (512, 1536), (512, 512), (256, 512), (256, 512), (512, 512), (512,), (512,)]
    params = [torch.nn.Parameter(torch.randn(*shape)) for shape in shapes * OPTIMIZER_LAYERS]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.AdamW(params, lr=1e-4, foreach=implementation == "foreach")
    # the first, untimed step allocates the moments
    return best_seconds(optimizer.step, budget_s) / sum(p.numel() for p in params)


def links_from(results: dict[int, Any]) -> tuple[float, float] | None:
    """(GB/s per rank, latency s) from rank 0's all-reduce sweep: the ring's cost
    ``2 (n-1) latency + size 2 (n-1)/n / bandwidth`` fitted by least squares over the sizes."""
    rows = (results.get(0) or {}).get("collectives") or {}
    sweep = next((v for k, v in rows.items() if k.startswith("allreduce|")), None)
    groups = (results.get(0) or {}).get("groups") or {}
    n = max(2, len(next(iter(groups.values()), [0, 1])))
    if not sweep or len(sweep) < 2:
        return None
    xs = [r["size"] * 2 * (n - 1) / n for r in sweep]
    ys = [r["seconds"] for r in sweep]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / max(sum((x - mean_x) ** 2 for x in xs), 1e-30)
    if slope <= 0:
        return None
    intercept = max(0.0, mean_y - slope * mean_x)
    return 1 / slope / 1e9, intercept / (2 * (n - 1))


def measure_local_profile(device: str, device_name: str, results: dict[int, Any] | None = None,
                          gpus_per_node: int = 1, *, quick: bool = False) -> DeviceProfile:
    """``quick`` (``primus preflight --quick``): shorter probes, a few seconds in all."""
    import torch

    from primus.plan.devices import (device_key, measure_cpu_gemm_tflops, measure_cpu_grouped_gemm_tflops,
                                     measure_cpu_training_gemm_tflops)
    from primus.preflight.perf.compute import gemm, memory_bandwidth

    link = links_from(results or {}) or DEFAULT_LINK
    if device.startswith("cuda"):
        base = PROFILES.get(device_key(device_name) or "", PROFILES["h100"])
        tflops = gemm(device, quick=True)["gflops"] / 1e3
        hbm = memory_bandwidth(device, quick=True)["gbps"]
        attention = attention_tflops(device, torch.bfloat16) / tflops
        efficiency = replace(base.efficiency, gemm=1.0, hbm=1.0, attention=min(1.0, attention),
                             attention_sdpa=min(1.0, attention), intra_link=1.0)
        return replace(base, name=f"local ({device_name})", peak_tflops={**base.peak_tflops, "bf16": tflops},
                       hbm_gbps=hbm, intra_node_gbps=link[0], intra_latency_s=link[1], efficiency=efficiency,
                       gpus_per_node=gpus_per_node, sources={"measured": _measured_when()})
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    previous = torch.get_num_threads()
    by_threads = {}
    try:
        for threads in sorted({1, cores}):
            by_threads[threads] = measure_cpu_gemm_tflops("fp32", threads, budget_s=0.3 if quick else 1.0)
        # bf16 GEMMs: faster than fp32 with AMX / AVX512-BF16 units, many times slower without (emulated)
        bf16 = measure_cpu_gemm_tflops("bf16", cores, budget_s=0.3 if quick else 1.0)
        grouped = {dtype: measure_cpu_grouped_gemm_tflops(dtype, cores, budget_s=0.3 if quick else 1.0)
                   for dtype in ("fp32", "bf16")}
        in_step = measure_cpu_training_gemm_tflops(cores, budget_s=0.3 if quick else 1.0)
        torch.set_num_threads(cores)
        optimizer = optimizer_s_per_param(0.3 if quick else 1.0)
        optimizer_foreach = optimizer_s_per_param(0.3 if quick else 1.0, "foreach")
        hbm = memory_bandwidth("cpu", quick=quick)["gbps"]
        attention = attention_tflops("cpu", torch.float32, 3 if quick else 10) / by_threads[cores]
        overhead = kernel_overhead_s()
    finally:
        torch.set_num_threads(previous)
    peak = by_threads[cores]
    efficiency = Efficiency(**{**CPU_EFFICIENCY, "gemm": min(1.0, in_step / peak)}, attention=min(1.0, attention),
                            attention_sdpa=min(1.0, attention), kernel_overhead_s=overhead)
    profile = DeviceProfile(name=f"local (cpu, {cores} cores)", peak_tflops={"bf16": bf16, "fp32": peak}, hbm_gbps=hbm,
                         memory_gib=_host_memory_gib(), intra_node_gbps=link[0], inter_node_gbps=link[0],
                         intra_latency_s=link[1], inter_latency_s=link[1], efficiency=efficiency,
                         gpus_per_node=gpus_per_node, sources={"measured": _measured_when()},
                         gemm_tflops_by_threads=by_threads, cores=cores, overlaps_comm=False,
                         grouped_gemm_tflops=grouped, reduce_scatter_as_allreduce=True,  # gloo
                         optimizer_s_per_param=optimizer, optimizer_foreach_s_per_param=optimizer_foreach)
    from primus.preflight.perf.reference_step import compute_efficiency_by_threads

    by_threads_compute = compute_efficiency_by_threads(profile, 0.3 if quick else 1.0)
    return replace(profile, compute_efficiency_by_threads=by_threads_compute,
                   efficiency=replace(efficiency, compute=by_threads_compute[cores]))


def _measured_when() -> str:
    """Where, when and under what load the probes ran: a profile measured on a busy host projects slow, and
    the end-of-run line that compares a run with it says so."""
    load = f", load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores" if hasattr(os, "getloadavg") else ""
    return f"primus preflight on this host, {time.strftime('%Y-%m-%d %H:%M', time.localtime())}{load}"


def _host_memory_gib() -> float:
    try:
        for line in open("/proc/meminfo", encoding="utf-8"):
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 16.0


def record(device: str, device_name: str, results: dict[int, Any], gpus_per_node: int, *, quick: bool = False) -> str:
    """Measure and write the profile; the path, for the preflight summary line."""
    profile = measure_local_profile(device, device_name, results, gpus_per_node, quick=quick)
    return str(write_local_profile(profile))
