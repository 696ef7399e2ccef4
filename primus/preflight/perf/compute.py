"""GEMM throughput and device-memory bandwidth of one rank (bf16 on GPU, fp32 on CPU)."""
from __future__ import annotations

import time
from typing import Any


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn, device: str, warmup: int, iters: int) -> float:
    """Seconds per call, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / iters


def gemm(device: str, *, quick: bool) -> dict[str, Any]:
    """Square matmul C = A @ B: 2 * n^3 FLOPs per call."""
    import torch

    gpu = device.startswith("cuda")
    n = (4096 if quick else 8192) if gpu else (512 if quick else 1024)
    dtype = torch.bfloat16 if gpu else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    iters = 10 if quick else 50
    seconds = _timed(lambda: torch.mm(a, b), device, warmup=2, iters=iters)
    if not gpu:  # the CPU's measured peak, cached for the [TRAIN] line's MFU
        from primus.plan.devices import record_cpu_peak

        record_cpu_peak("fp32", torch.get_num_threads(), 2 * n**3 / seconds / 1e12)
    return {"dtype": str(dtype).replace("torch.", ""), "n": n, "iters": iters, "seconds": seconds,
            "gflops": 2 * n**3 / seconds / 1e9}


def memory_bandwidth(device: str, *, quick: bool) -> dict[str, Any]:
    """Copy one buffer into another: 2 x bytes moved per call (one read, one write)."""
    import torch

    gpu = device.startswith("cuda")
    nbytes = (256 if quick else 1024) * 2**20 if gpu else (32 if quick else 256) * 2**20
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    iters = 5 if quick else 20
    seconds = _timed(lambda: dst.copy_(src), device, warmup=1, iters=iters)
    return {"bytes": nbytes, "iters": iters, "seconds": seconds, "gbps": 2 * nbytes / seconds / 1e9}
