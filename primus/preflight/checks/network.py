"""RDMA devices and link rates, NCCL_IB_HCA, and which collective library is in use."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from primus.preflight.checks import Context, majority_outliers
from primus.preflight.findings import Finding, describe_ranks, fail, info, warn

IB_ROOT = Path("/sys/class/infiniband")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def rdma_devices(root: Path = IB_ROOT) -> list[dict[str, Any]]:
    devices = []
    for dev in sorted(root.glob("*")) if root.is_dir() else []:
        ports = []
        for port in sorted((dev / "ports").glob("*")):
            ports.append({"port": port.name, "state": _read(port / "state"), "rate": _read(port / "rate"),
                          "link_layer": _read(port / "link_layer")})
        devices.append({"name": dev.name, "ports": ports})
    return devices


def _library() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    lib: dict[str, Any] = {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(), "nccl_version": None}
    if torch.cuda.is_available() and dist.is_nccl_available():
        try:
            version = torch.cuda.nccl.version()
            lib["nccl_version"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except Exception:  # noqa: BLE001 - a missing symbol in an odd build is a fact, not a crash
            pass
    lib["name"] = ("RCCL" if torch.version.hip else "NCCL") if torch.cuda.is_available() else "gloo"
    return lib


def collect(options: dict[str, Any]) -> dict[str, Any]:
    return {"rdma": rdma_devices(), "library": _library(), "ib_hca": os.environ.get("NCCL_IB_HCA")}


def hca_names(spec: str) -> list[str]:
    """Device names in ``NCCL_IB_HCA`` (``^`` and ``=`` prefixes, ``dev:port`` entries)."""
    spec = spec.lstrip("^").lstrip("=")
    return [entry.split(":")[0] for entry in spec.split(",") if entry]


def evaluate(ranks: dict[int, dict[str, Any]], ctx: Context) -> list[Finding]:
    facts = {r: f["network"] for r, f in ranks.items() if "network" in f}
    if not facts:
        return []
    check = "network"
    found: list[Finding] = []
    libs = {r: f"{f['library']['name']} {f['library']['nccl_version'] or ''}".strip() for r, f in facts.items()}
    common, odd = majority_outliers(libs)
    found.append(info(check, f"collective library: {common}"))
    if odd:
        found.append(warn(check, f"collective library versions differ: {common} on most, other on "
                          f"{describe_ranks(odd, ctx.hosts)}", odd))
    for host, rank in ctx.first_rank_per_host().items():
        f = facts.get(rank)
        if f is None:
            continue
        devices = f["rdma"]
        if devices:
            ports = [f"{d['name']}/{p['port']} {p['rate'] or '?'} {p['state'] or '?'}" for d in devices for p in d["ports"]]
            found.append(info(check, f"{host}: RDMA {', '.join(ports)}", [rank], devices=devices))
            down = [f"{d['name']}/{p['port']}" for d in devices for p in d["ports"]
                    if p["state"] and "ACTIVE" not in p["state"]]
            if down:
                found.append(warn(check, f"{host}: RDMA ports not active: {', '.join(down)}", [rank]))
        elif ctx.multi_node:
            found.append(warn(check, f"{host}: no RDMA devices under {IB_ROOT}: traffic between nodes goes over "
                              "TCP sockets", [rank]))
        if f["ib_hca"] and not f["ib_hca"].startswith("^"):
            present = {d["name"] for d in devices}
            absent = [n for n in hca_names(f["ib_hca"]) if not any(p.startswith(n) for p in present)]
            if absent:
                found.append(fail(check, f"{host}: NCCL_IB_HCA names {', '.join(absent)} but the host has "
                                  f"{', '.join(sorted(present)) or 'no RDMA devices'}", [rank]))
    if not ctx.multi_node:
        found.append(info(check, "single host: only intra-node links are exercised"))
    rates = {r: sorted({p["rate"] for d in facts[r]["rdma"] for p in d["ports"]}) for r in ctx.first_rank_per_host().values()
             if r in facts and facts[r]["rdma"]}
    common_rate, odd = majority_outliers(rates)
    if odd:
        found.append(warn(check, f"RDMA link rates differ: {common_rate} on most hosts, other on "
                          f"{describe_ranks(odd, ctx.hosts)}", odd))
    return found
