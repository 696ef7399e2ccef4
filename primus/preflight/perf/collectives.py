"""Collective bandwidth over message-size sweeps, with the nccl-tests definitions.

``size`` is the nccl-tests "size" in bytes:

* all-reduce: the tensor each rank holds;
* all-gather: the gathered output (each rank contributes size / n);
* reduce-scatter: the input (each rank keeps size / n);
* all-to-all: each rank's send buffer (size / n to every peer);
* sendrecv: what each rank sends to the next rank of a ring (and receives from the previous).

``time`` is seconds per operation, averaged over the timed iterations on each rank; a
group's time is the slowest rank's (the collective is done when its last rank is).

    algbw = size / time                                  (GB/s, 1 GB = 1e9 bytes)
    busbw = algbw * factor(n), n = ranks in the group:
        all-reduce            2 * (n - 1) / n
        all-gather            (n - 1) / n
        reduce-scatter        (n - 1) / n
        all-to-all            (n - 1) / n
        sendrecv              1

busbw is comparable to the hardware link bandwidth whatever n is (nccl-tests,
doc/PERFORMANCE.md); algbw is what a training step sees.
"""
from __future__ import annotations

import time
from typing import Any

from primus.preflight.perf.compute import synchronize

BUS_FACTOR_DOC = {"allreduce": "2(n-1)/n", "allgather": "(n-1)/n", "reducescatter": "(n-1)/n",
                  "alltoall": "(n-1)/n", "sendrecv": "1"}


def bus_factor(op: str, n: int) -> float:
    if op == "allreduce":
        return 2 * (n - 1) / n
    if op in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    if op == "sendrecv":
        return 1.0
    raise ValueError(f"unknown collective {op!r}")


def bandwidths(op: str, size: int, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s."""
    algbw = size / seconds / 1e9
    return algbw, algbw * bus_factor(op, n)


def default_sizes(device: str, quick: bool) -> list[int]:
    if quick:
        return [64 * 2**10, 1 * 2**20, 4 * 2**20]
    top = 1 * 2**30 if device.startswith("cuda") else 64 * 2**20
    sizes, size = [], 4 * 2**10
    while size <= top:
        sizes.append(size)
        size *= 4
    return sizes


def operation(op: str, size: int, group, device: str):
    """A zero-argument callable running one collective of ``size`` bytes on ``group``."""
    import torch
    import torch.distributed as dist

    n = dist.get_world_size(group)
    me = dist.get_rank(group)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    elem = torch.tensor([], dtype=dtype).element_size()
    count = max(n, size // elem // n * n)  # a multiple of n elements
    if op == "allreduce":
        buf = torch.ones(count, dtype=dtype, device=device)
        return lambda: dist.all_reduce(buf, group=group)
    if op == "allgather":
        out = torch.empty(count, dtype=dtype, device=device)
        mine = torch.ones(count // n, dtype=dtype, device=device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
        return lambda: gather(out, mine, group=group)
    if op == "reducescatter":
        full = torch.ones(count, dtype=dtype, device=device)
        out = torch.empty(count // n, dtype=dtype, device=device)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # renamed in torch 2.13
        return lambda: scatter(out, full, group=group)
    if op == "alltoall":
        send = torch.ones(count, dtype=dtype, device=device)
        recv = torch.empty(count, dtype=dtype, device=device)
        return lambda: dist.all_to_all_single(recv, send, group=group)
    if op == "sendrecv":
        ranks = dist.get_process_group_ranks(group)
        send = torch.ones(count, dtype=dtype, device=device)
        recv = torch.empty(count, dtype=dtype, device=device)
        nxt, prv = ranks[(me + 1) % n], ranks[(me - 1) % n]

        def ring() -> None:
            ops = [dist.P2POp(dist.isend, send, nxt, group), dist.P2POp(dist.irecv, recv, prv, group)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        return ring
    raise ValueError(f"unknown collective {op!r}")


def run_sweep(op: str, sizes: list[int], group, device: str, *, warmup: int, iters: int) -> list[dict[str, Any]]:
    """This rank's seconds per operation at each size (rank 0 combines the ranks' times)."""
    import torch.distributed as dist

    results = []
    for size in sizes:
        fn = operation(op, size, group, device)
        for _ in range(warmup):
            fn()
        synchronize(device)
        dist.barrier(group=group)
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        synchronize(device)
        results.append({"size": size, "seconds": (time.perf_counter() - start) / iters})
    return results


def combine(op: str, group_name: str, group_ranks: list[int], per_rank: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per size: the slowest rank's time, algbw and busbw, and each rank's time."""
    n = len(group_ranks)
    rows = []
    sizes = [entry["size"] for entry in next(iter(per_rank.values()))]
    for i, size in enumerate(sizes):
        times = {r: per_rank[r][i]["seconds"] for r in per_rank}
        seconds = max(times.values())
        algbw, busbw = bandwidths(op, size, seconds, n)
        rows.append({"op": op, "group": group_name, "ranks": group_ranks, "n": n, "size": size,
                     "seconds": seconds, "algbw_gbps": algbw, "busbw_gbps": busbw,
                     "bus_factor": bus_factor(op, n), "per_rank_seconds": {str(r): t for r, t in times.items()}})
    return rows
