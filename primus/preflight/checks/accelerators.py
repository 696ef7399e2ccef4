"""GPUs on each host: count, model, memory, driver and topology; an explicit finding on CPU hosts."""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

from primus.preflight.checks import Context, majority_outliers
from primus.preflight.findings import Finding, describe_ranks, fail, info, warn

GIB = 1024**3


def _run(cmd: list[str], timeout: float = 15.0) -> str | None:
    """A vendor tool's output, or None when it is absent or fails (a fact, never an error)."""
    if not shutil.which(cmd[0]):
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _driver(flavour: str) -> str | None:
    if flavour == "cuda":
        out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        return out.splitlines()[0].strip() if out else None
    out = _run(["amd-smi", "version"]) or _run(["rocm-smi", "--showdriverversion"])
    if out:
        for line in out.splitlines():
            if "driver" in line.lower():
                return line.split(":", 1)[-1].strip()
    return None


def _topology(flavour: str) -> str | None:
    if flavour == "cuda":
        return _run(["nvidia-smi", "topo", "-m"])
    return _run(["amd-smi", "topology"]) or _run(["rocm-smi", "--showtopo"])


def collect(options: dict[str, Any]) -> dict[str, Any]:
    import torch

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not torch.cuda.is_available():
        return {"available": False, "count": 0, "devices": [], "flavour": "cpu"}
    flavour = "rocm" if torch.version.hip else "cuda"
    count = torch.cuda.device_count()
    devices = []
    for index in range(count):
        props = torch.cuda.get_device_properties(index)
        arch = getattr(props, "gcnArchName", None) or f"sm_{props.major}{props.minor}"
        devices.append({"index": index, "name": props.name, "arch": arch, "memory_total": props.total_memory})
    mine = local_rank % count
    torch.cuda.set_device(mine)
    free, total = torch.cuda.mem_get_info(mine)  # only our own device: no context on the others
    facts = {"available": True, "flavour": flavour, "count": count, "devices": devices, "local_device": mine,
             "memory_free": free, "memory_total": total, "driver": _driver(flavour)}
    if local_rank == 0:  # once per host
        facts["topology"] = _topology(flavour)
    return facts


def evaluate(ranks: dict[int, dict[str, Any]], ctx: Context) -> list[Finding]:
    facts = {r: f["accelerators"] for r, f in ranks.items() if "accelerators" in f}
    if not facts:
        return []
    check = "accelerators"
    found: list[Finding] = []
    without = sorted(r for r, f in facts.items() if not f["available"])
    if len(without) == len(facts):
        level = fail if ctx.thresholds["accelerators"]["require"] else warn
        return [level(check, f"no accelerator on {', '.join(ctx.host_names)}: torch sees no GPU, preflight runs "
                      "on CPU with gloo", without, hosts=ctx.host_names)]
    if without:
        found.append(fail(check, f"no accelerator on {describe_ranks(without, ctx.hosts)} while other ranks have one",
                          without))
    have = {r: f for r, f in facts.items() if f["available"]}
    common, odd = majority_outliers({r: f["count"] for r, f in have.items()})
    if odd:
        found.append(fail(check, f"accelerator count differs: {common} on most ranks, other on "
                          f"{describe_ranks(odd, ctx.hosts)}", odd))
    names = {r: f["devices"][f["local_device"]]["name"] for r, f in have.items()}
    common_name, odd = majority_outliers(names)
    if odd:
        found.append(fail(check, f"accelerator models differ: {common_name} on most ranks, other on "
                          f"{describe_ranks(odd, ctx.hosts)}", odd, models={r: names[r] for r in odd}))
    first = have[min(have)]
    found.append(info(check, f"{first['count']} x {common_name} ({first['devices'][0]['arch']}, "
                      f"{first['memory_total'] / GIB:.0f} GiB) per host, {first['flavour'].upper()}, "
                      f"driver {first.get('driver') or 'unknown'}"))
    for host, rank in ctx.first_rank_per_host().items():
        on_host = [r for r, h in ctx.hosts.items() if h == host]
        count = facts.get(rank, {}).get("count", 0)
        if count and len(on_host) > count:
            found.append(fail(check, f"{host}: {len(on_host)} ranks but {count} accelerator(s)", on_host))
        local = sorted(have[r]["local_device"] for r in on_host if r in have)
        if len(set(local)) < len(local):
            found.append(warn(check, f"{host}: several ranks share one accelerator (devices {local})", on_host))
    common_driver, odd = majority_outliers({r: f.get("driver") for r, f in have.items()})
    if odd:
        found.append(warn(check, f"driver versions differ: {common_driver} on most, other on "
                          f"{describe_ranks(odd, ctx.hosts)}", odd))
    floor = ctx.thresholds["accelerators"]["min_free_fraction"]
    busy = sorted(r for r, f in have.items() if f["memory_free"] < floor * f["memory_total"])
    if busy:
        found.append(warn(check, f"accelerator memory already in use on {describe_ranks(busy, ctx.hosts)} "
                          f"(free under {floor:.0%}): another process holds it", busy,
                          free={r: have[r]["memory_free"] for r in busy}))
    return found
