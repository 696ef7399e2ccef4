"""CPU, memory, NUMA, /dev/shm, process limits and free disk of each host."""
from __future__ import annotations

import glob
import os
import platform
import resource
import shutil
from pathlib import Path
from typing import Any

from primus.preflight.checks import Context
from primus.preflight.findings import Finding, info, warn

GIB = 1024**3


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _limit(which: int) -> list[int | None]:
    soft, hard = resource.getrlimit(which)
    return [None if v == resource.RLIM_INFINITY else v for v in (soft, hard)]  # None = unlimited


def _disk(path: str) -> dict[str, Any]:
    probe = Path(path).resolve()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    return {"path": str(probe), "total": usage.total, "free": usage.free}


def collect(options: dict[str, Any]) -> dict[str, Any]:
    import psutil

    memory = psutil.virtual_memory()
    shm = _disk("/dev/shm") if os.path.isdir("/dev/shm") else None
    return {
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_total": memory.total,
        "memory_available": memory.available,
        "numa_nodes": len(glob.glob("/sys/devices/system/node/node[0-9]*")) or 1,
        "shm": shm,
        "nofile": _limit(resource.RLIMIT_NOFILE),
        "memlock": _limit(resource.RLIMIT_MEMLOCK),
        "workspace": _disk(options.get("workspace") or os.getcwd()),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def evaluate(ranks: dict[int, dict[str, Any]], ctx: Context) -> list[Finding]:
    t = ctx.thresholds["host"]
    found: list[Finding] = []
    for host, rank in ctx.first_rank_per_host().items():
        f = ranks.get(rank, {}).get("host")
        if not f:
            continue
        on_host = [r for r, h in ctx.hosts.items() if h == host]
        found.append(info("host", f"{host}: {f['cpu_model']}, {f['cpus_usable']}/{f['cpus']} CPUs usable, "
                          f"{f['memory_total'] / GIB:.0f} GiB memory ({f['memory_available'] / GIB:.0f} free), "
                          f"{f['numa_nodes']} NUMA node(s), {len(on_host)} rank(s)", [rank]))
        if f["cpus_usable"] and len(on_host) > f["cpus_usable"]:
            found.append(warn("host", f"{host}: {len(on_host)} ranks share {f['cpus_usable']} usable CPUs", on_host))
        shm = f["shm"]
        if shm is None:
            found.append(warn("host", f"{host}: /dev/shm is missing", [rank]))
        elif shm["total"] < t["min_shm_gib"] * GIB:
            found.append(warn("host", f"{host}: /dev/shm is {shm['total'] / GIB:.2f} GiB, under "
                              f"{t['min_shm_gib']} GiB (DataLoader workers and NCCL's shared-memory transport "
                              f"need it; docker: --shm-size)", [rank], shm_bytes=shm["total"]))
        soft_nofile = f["nofile"][0]
        if soft_nofile is not None and soft_nofile < t["min_nofile"]:
            found.append(warn("host", f"{host}: open-file limit is {soft_nofile}, under {t['min_nofile']} "
                              "(ulimit -n)", [rank]))
        has_rdma = bool(ranks.get(rank, {}).get("network", {}).get("rdma"))
        if has_rdma and f["memlock"][0] is not None:
            found.append(warn("host", f"{host}: locked-memory limit is {f['memlock'][0]} bytes with RDMA devices "
                              "present; RDMA needs 'ulimit -l unlimited'", [rank]))
        disk = f["workspace"]
        if disk["free"] < t["min_disk_free_gib"] * GIB:
            found.append(warn("host", f"{host}: {disk['free'] / GIB:.1f} GiB free at {disk['path']}, under "
                              f"{t['min_disk_free_gib']} GiB (checkpoints, logs)", [rank]))
    models = {ranks[r]["host"]["cpu_model"] for r in ctx.first_rank_per_host().values() if "host" in ranks.get(r, {})}
    if len(models) > 1:
        found.append(warn("host", f"hosts have different CPUs: {', '.join(sorted(models))}"))
    return found
