"""Rendezvous variables, socket interfaces and the torch build (CUDA, ROCm or CPU)."""
from __future__ import annotations

import fnmatch
import os
import socket
from typing import Any

from primus.preflight.checks import Context, majority_outliers
from primus.preflight.findings import Finding, describe_ranks, fail, info, warn

RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK")
TOPOLOGY = ("LOCAL_WORLD_SIZE", "NNODES", "NODE_RANK", "GROUP_RANK")
OTHER = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_DEBUG", "CUDA_VISIBLE_DEVICES",
         "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "SLURM_JOB_ID", "SLURM_NODELIST", "OMP_NUM_THREADS")


def _interfaces() -> dict[str, dict[str, Any]]:
    import psutil

    stats = psutil.net_if_stats()
    result = {}
    for name, addrs in psutil.net_if_addrs().items():
        ipv4 = [a.address for a in addrs if a.family == socket.AF_INET]
        result[name] = {"ipv4": ipv4, "up": bool(stats.get(name) and stats[name].isup),
                        "speed_mbps": stats[name].speed if name in stats else None}
    return result


def _torch_build() -> dict[str, Any]:
    import torch

    flavour = "rocm" if torch.version.hip else "cuda" if torch.version.cuda else "cpu"
    return {"torch": torch.__version__, "flavour": flavour, "cuda": torch.version.cuda, "hip": torch.version.hip}


def collect(options: dict[str, Any]) -> dict[str, Any]:
    env = {key: os.environ.get(key) for key in (*RENDEZVOUS, *TOPOLOGY, *OTHER)}
    return {"env": env, "hostname": socket.gethostname(), "interfaces": _interfaces(), "build": _torch_build()}


def match_socket_ifname(spec: str, names: list[str]) -> list[str]:
    """Interfaces NCCL would use for ``NCCL_SOCKET_IFNAME=spec``: comma-separated prefixes,
    ``^`` to exclude, ``=`` for exact names (NCCL docs, "NCCL_SOCKET_IFNAME")."""
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    patterns = [p for p in spec.split(",") if p]

    def hit(name: str) -> bool:
        return any(name == p if exact else name.startswith(p) for p in patterns)

    return [n for n in names if hit(n) != exclude]


def is_suspicious(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in patterns)


def evaluate(ranks: dict[int, dict[str, Any]], ctx: Context) -> list[Finding]:
    facts = {r: f["environment"] for r, f in ranks.items() if "environment" in f}
    if not facts:
        return []
    found: list[Finding] = []
    check = "environment"
    for key in RENDEZVOUS:
        missing = [r for r, f in facts.items() if not f["env"].get(key)]
        if missing:
            found.append(warn(check, f"{key} is not set on {describe_ranks(missing, ctx.hosts)}", missing))
    for key in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NNODES", "LOCAL_WORLD_SIZE", "NCCL_IB_HCA"):
        common, odd = majority_outliers({r: f["env"].get(key) for r, f in facts.items()})
        if odd:
            found.append(fail(check, f"{key} differs across ranks: {common!r} on most, other values on "
                              f"{describe_ranks(odd, ctx.hosts)}", odd,
                              values={r: facts[r]["env"].get(key) for r in odd}))
    env_ranks = {r: f["env"].get("RANK") for r, f in facts.items()}
    wrong = [r for r, value in env_ranks.items() if value is not None and value != str(r)]
    if wrong:
        found.append(fail(check, f"RANK does not match the joined rank on {describe_ranks(wrong, ctx.hosts)}", wrong))
    nnodes = next((f["env"].get("NNODES") for f in facts.values() if f["env"].get("NNODES")), None)
    if nnodes and nnodes.isdigit() and int(nnodes) != len(ctx.host_names):
        found.append(warn(check, f"NNODES={nnodes} but ranks joined from {len(ctx.host_names)} host(s): "
                          f"{', '.join(ctx.host_names)}"))
    local_ws = {r: f["env"].get("LOCAL_WORLD_SIZE") for r, f in facts.items()}
    for host, first in ctx.first_rank_per_host().items():
        on_host = [r for r in facts if ctx.hosts.get(r) == host]
        declared = local_ws.get(first)
        if declared and declared.isdigit() and int(declared) != len(on_host):
            found.append(warn(check, f"LOCAL_WORLD_SIZE={declared} on {host} but {len(on_host)} rank(s) joined from it"))
    master = next(iter(facts.values()))["env"].get("MASTER_ADDR") or ""
    if ctx.multi_node and (master.startswith("127.") or master == "localhost"):
        found.append(fail(check, f"MASTER_ADDR={master} is a loopback address but ranks run on "
                          f"{len(ctx.host_names)} hosts: the other hosts cannot reach it"))
    found += _socket_findings(facts, ctx)
    builds = {r: f["build"]["torch"] for r, f in facts.items()}
    common, odd = majority_outliers(builds)
    first = next(iter(facts.values()))["build"]
    flavour = {"cpu": "CPU-only build", "cuda": f"CUDA {first['cuda']}", "rocm": f"ROCm/HIP {first['hip']}"}[first["flavour"]]
    found.append(info(check, f"torch {common} ({flavour}); {len(facts)} rank(s) on {len(ctx.host_names)} host(s)",
                      flavour=first["flavour"]))
    if odd:
        found.append(fail(check, f"torch versions differ: {common} on most, other on {describe_ranks(odd, ctx.hosts)}", odd))
    return found


def _socket_findings(facts: dict[int, dict[str, Any]], ctx: Context) -> list[Finding]:
    found: list[Finding] = []
    suspicious = ctx.thresholds["network"]["suspicious_interfaces"]
    for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        unmatched, risky = [], []
        for r, f in facts.items():
            spec = f["env"].get(var)
            if not spec:
                continue
            names = sorted(f["interfaces"])
            if var == "GLOO_SOCKET_IFNAME":  # gloo takes exact names, comma-separated
                chosen = [n for n in spec.split(",") if n in names]
            else:
                chosen = match_socket_ifname(spec, names)
            if not chosen:
                unmatched.append(r)
            elif ctx.multi_node and all(is_suspicious(n, suspicious) for n in chosen):
                risky.append(r)
        if unmatched:
            r0 = unmatched[0]
            found.append(fail("environment", f"{var}={facts[r0]['env'][var]} matches no interface on "
                              f"{describe_ranks(unmatched, ctx.hosts)} (has: {', '.join(sorted(facts[r0]['interfaces']))})",
                              unmatched))
        if risky:
            found.append(warn("environment", f"{var}={facts[risky[0]]['env'][var]} selects only loopback/bridge "
                              f"interfaces on {describe_ranks(risky, ctx.hosts)}, wrong for traffic between nodes", risky))
        if ctx.multi_node and not any(f["env"].get(var) for f in facts.values()):
            found.append(info("environment", f"{var} is not set: the library picks an interface itself "
                              f"(it skips lo and docker* by default)"))
    return found
