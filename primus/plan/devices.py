"""Accelerator peaks and memory sizes, for MFU and for "does it fit" (vendor data sheets)."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

# Dense peak TFLOP/s per device (no sparsity), by dtype. Sources: vendor data sheets.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "h100": {"bf16": 989.0, "fp32": 67.0},
    "h200": {"bf16": 989.0, "fp32": 67.0},
    "b200": {"bf16": 2250.0, "fp32": 80.0},
    "a100": {"bf16": 312.0, "fp32": 19.5},
    "mi300x": {"bf16": 1307.4, "fp32": 163.4},
    "mi325x": {"bf16": 1307.4, "fp32": 163.4},
    "mi355x": {"bf16": 2516.6, "fp32": 157.3},
}


# Device memory per accelerator, GiB as the runtime reports it (vendor data sheets).
DEVICE_MEMORY_GIB: dict[str, float] = {
    "a100": 80.0,
    "h100": 80.0,
    "h200": 141.0,
    "b200": 180.0,
    "mi300x": 192.0,
    "mi325x": 256.0,
    "mi355x": 288.0,
}


def device_key(device_name: str) -> str | None:
    """Map a device name (``NVIDIA H100 80GB HBM3``, ``AMD Instinct MI300X``) to a peak key."""
    lowered = device_name.lower().replace(" ", "")
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if key in lowered:
            return key
    return None


def peak_tflops(device_name: str, dtype: str = "bf16", override: float | None = None) -> float | None:
    """Peak TFLOP/s for MFU; ``None`` where unknown (CPU) so MFU reads n/a, not invented."""
    if override is None and os.environ.get("PRIMUS_PEAK_TFLOPS"):
        override = float(os.environ["PRIMUS_PEAK_TFLOPS"])
    if override:
        return float(override)
    key = device_key(device_name)
    if key is None:
        return None
    return PEAK_TFLOPS[key].get(dtype)


# --- CPUs: no data sheet to read, so the peak is measured (a GEMM probe, cached per host) -------

CPU_BF16_ENV = "PRIMUS_CPU_BF16"  # auto (default) | force | off: bf16 on a CPU without native bf16 units


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def cpu_bf16_native() -> str | None:
    """The CPU's native bf16 matmul unit (``amx_bf16`` or ``avx512_bf16``), or ``None``: without one,
    oneDNN emulates bf16 by converting to fp32, slower than fp32 itself (measured ~5x on an AVX-512
    Xeon without AVX512-BF16). Reads /proc/cpuinfo (the kernel's cpuid flags; no torch import, so
    ``plan`` stays fast), else asks torch's cpuid probe (other systems)."""
    try:
        flags = next(line for line in open("/proc/cpuinfo", encoding="utf-8") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        flags = None
    if flags is not None:
        return next((flag for flag in ("amx_bf16", "avx512_bf16") if flag in flags), None)
    try:
        import torch

        if torch.cpu._is_amx_tile_supported() and torch._C._cpu._get_cpu_capability().get("amx_bf16"):
            return "amx_bf16"
        if torch.cpu._is_avx512_bf16_supported():
            return "avx512_bf16"
    except (AttributeError, ImportError, RuntimeError):
        pass
    return None


def cpu_bf16_decision() -> tuple[bool, str]:
    """Whether bf16 asked for on this CPU is kept, and why (the reason goes into a derived line).
    ``PRIMUS_CPU_BF16=force`` keeps it on any CPU (to test the bf16 path), ``off`` never."""
    mode = os.environ.get(CPU_BF16_ENV, "auto").strip().lower()
    if mode in ("force", "1", "on", "true"):
        return True, f"{CPU_BF16_ENV}={mode}"
    if mode in ("off", "0", "false"):
        return False, f"{CPU_BF16_ENV}={mode}"
    unit = cpu_bf16_native()
    if unit:
        return True, f"this CPU has {unit.upper().replace('_', '-')}"
    return False, ("this CPU has no native bf16 (no AMX-BF16 / AVX512-BF16): bf16 matmuls would be emulated, "
                   f"slower than fp32; {CPU_BF16_ENV}=force keeps bf16")


def _peak_cache_path():
    from pathlib import Path

    root = os.environ.get("PRIMUS_PEAK_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "primus", "cpu_peaks.json")
    return Path(root)


def cpu_peak_key(dtype: str, threads: int) -> str:
    import torch

    return f"{cpu_model()} | torch {torch.__version__} | {threads} threads | {dtype}"


@contextlib.contextmanager
def intra_op_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to ``threads`` (None: as it is) for the block only."""
    import torch

    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def best_seconds(step: Callable[[], Any], budget_s: float) -> float:
    """Best-of time of ``step`` within about ``budget_s`` (its first, untimed call included: thread pool,
    kernel selection, buffers): load on the host only ever slows a trial."""
    import time

    start = time.perf_counter()
    step()
    best = float("inf")
    while True:
        t = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t)
        if time.perf_counter() - start > budget_s:
            return best


def measure_cpu_gemm_tflops(dtype: str = "fp32", threads: int | None = None, budget_s: float = 0.5) -> float:
    """Best-of GEMM throughput of this process (TFLOP/s) within about ``budget_s`` (first call
    included): square matmuls of a few ms each, best trial kept (load only ever lowers a trial)."""
    import torch

    with intra_op_threads(threads):
        torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
        n = 1024 if dtype == "fp32" or cpu_bf16_native() else 512
        a, b = torch.randn(n, n, dtype=torch_dtype), torch.randn(n, n, dtype=torch_dtype)

        def four() -> None:
            for _ in range(4):
                torch.mm(a, b)

        return 4 * 2 * n**3 / best_seconds(four, budget_s) / 1e12


def measure_cpu_grouped_gemm_tflops(dtype: str = "fp32", threads: int | None = None, budget_s: float = 0.5,
                                    tokens: int = 2048, experts: int = 8, dim: int = 256, hidden: int = 512) -> float:
    """Best-of rate (TFLOP/s) of an MoE's expert GEMM as TorchTitan runs it: ``torch._grouped_mm`` of
    ``tokens`` routed rows over ``experts`` weights (``dim -> hidden``), forward and backward (the data and
    weight gradients are grouped GEMMs too, slower per FLOP than the forward on a CPU), 3 x 2 t d h FLOPs.
    On a CPU it is neither the plain GEMM's rate nor a fixed share of it (bf16 without bf16 units: several
    times faster than a plain bf16 mm; fp32: slower than a plain fp32 mm)."""
    import torch

    with intra_op_threads(threads):
        torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
        x = torch.randn(tokens, dim, dtype=torch_dtype, requires_grad=True)
        w = torch.randn(experts, hidden, dim, dtype=torch_dtype, requires_grad=True)
        offsets = torch.arange(1, experts + 1, dtype=torch.int32) * (tokens // experts)
        grad = torch.randn(tokens, hidden, dtype=torch_dtype)

        def step() -> None:
            torch._grouped_mm(x, w.transpose(-2, -1), offs=offsets).backward(grad)

        return 3 * 2 * tokens * dim * hidden / best_seconds(step, budget_s) / 1e12


def measure_cpu_training_gemm_tflops(threads: int | None = None, budget_s: float = 0.5, tokens: int = 512,
                                     dim: int = 512, hidden: int = 1536, layers: int = 4) -> float:
    """Best-of GEMM rate (TFLOP/s) of a training step's linears: a chain of ``layers`` MLPs
    (``dim -> hidden -> dim`` over ``tokens`` rows, fp32) forward and backward through autograd, 3 x the
    forward FLOPs. Below the square probe's rate on a CPU (each GEMM's inputs were just written by
    another op, and the backward's are transposed): its ratio to that probe is the local profile's
    GEMM efficiency."""
    import torch

    with intra_op_threads(threads):
        weights = [(torch.randn(dim, hidden, requires_grad=True), torch.randn(hidden, dim, requires_grad=True))
                   for _ in range(layers)]
        x = torch.randn(tokens, dim)

        def step() -> None:
            y = x
            for up, down in weights:
                y = (y @ up) @ down
            y.sum().backward()

        return 3 * layers * 2 * (2 * tokens * dim * hidden) / best_seconds(step, budget_s) / 1e12


def _read_peaks() -> dict[str, float]:
    import json

    try:
        return json.loads(_peak_cache_path().read_text())
    except (OSError, ValueError):
        return {}


def record_cpu_peak(dtype: str, threads: int, tflops: float) -> None:
    """Keep the best measurement per (CPU model, torch, threads, dtype); e.g. from ``primus preflight``."""
    import json

    key = cpu_peak_key(dtype, threads)
    peaks = _read_peaks()
    if tflops <= peaks.get(key, 0.0):
        return
    peaks[key] = tflops
    path = _peak_cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(peaks, indent=1, sort_keys=True))
        os.replace(tmp, path)  # two ranks writing at once: one complete file wins
    except OSError:
        pass  # a read-only home: the peak is measured again next time


def cpu_peak_tflops(dtype: str, threads: int, *, probe: bool = True) -> tuple[float | None, str]:
    """(peak TFLOP/s, where it came from) for this CPU at ``threads`` intra-op threads."""
    cached = _read_peaks().get(cpu_peak_key(dtype, threads))
    if cached:
        return cached, f"measured {dtype} GEMM, {threads} threads, cached in {_peak_cache_path()}"
    if not probe:
        return None, "not measured yet on this host"
    tflops = measure_cpu_gemm_tflops(dtype, threads)
    record_cpu_peak(dtype, threads, tflops)
    return tflops, f"measured {dtype} GEMM just now, {threads} threads (cached in {_peak_cache_path()})"


def device_peak(device_name: str, dtype: str = "bf16", override: float | None = None, *,
                probe: bool = True) -> tuple[float | None, str]:
    """(peak TFLOP/s for MFU, its source) on any device: an explicit override, the data-sheet
    table for known accelerators, a measured GEMM on CPU. The CPU's peak is its fastest native
    dtype: the bf16 peak where bf16 units exist, the fp32 peak otherwise (unless fp32 is asked)."""
    table = peak_tflops(device_name, dtype, override)
    if table is not None:
        return table, "override" if (override or os.environ.get("PRIMUS_PEAK_TFLOPS")) else f"{device_name} data sheet"
    if device_name.lower() != "cpu":
        return None, f"no peak known for {device_name}"
    import torch

    if dtype == "bf16" and not cpu_bf16_native():
        dtype = "fp32"
    return cpu_peak_tflops(dtype, torch.get_num_threads(), probe=probe)
