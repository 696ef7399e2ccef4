"""What every rank runs for ``primus preflight``.

1. Collect this rank's facts (environment, host, accelerators, network).
2. Announce them in the job's TCPStore; rank 0 waits until ``timeout`` and, if ranks are
   missing, names them (rank and host) in the report and stops everyone: no hang.
3. Build the process group on that store (NCCL/RCCL on GPUs plus a gloo group, gloo alone
   on CPU) and pass a monitored barrier, which also names ranks that stall.
4. Run the performance tests; publish results to the store; rank 0 judges and reports.

Exit status (rank 0's is the job's): 0 no ``fail`` finding; 1 at least one ``fail``
(missing ranks included); 2 a user error in the options (``ConfigError``). Other ranks
return 0 unless they could not take part.

Run by hand: ``python -m torch.distributed.run --standalone --nproc-per-node 2 -m
primus.preflight.worker options.json``.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from datetime import timedelta
from typing import Any

from primus.config.errors import ConfigError
from primus.preflight import rendezvous as rdv
from primus.preflight.checks import COLLECTED, Context, module
from primus.preflight.findings import Finding, describe_ranks, fail, info
from primus.preflight.options import PreflightOptions
from primus.preflight.perf import COLLECTIVE_TESTS
from primus.plan.thresholds import load_thresholds

log = logging.getLogger("primus.preflight")


def _identity() -> dict[str, Any]:
    env = os.environ
    return {"rank": int(env.get("RANK", "0")), "world_size": int(env.get("WORLD_SIZE", "1")),
            "local_rank": int(env.get("LOCAL_RANK", "0")), "local_world_size": int(env.get("LOCAL_WORLD_SIZE", "1")),
            "master_addr": env.get("MASTER_ADDR", "127.0.0.1"), "master_port": int(env.get("MASTER_PORT", "29500")),
            "host": socket.gethostname(), "pid": os.getpid()}


def _device(identity: dict[str, Any]) -> str:
    import torch

    if torch.cuda.is_available():
        index = identity["local_rank"] % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return f"cuda:{index}"
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(max(1, usable // max(1, identity["local_world_size"])))  # no oversubscription
    return "cpu"


def _collect(opts: PreflightOptions) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    for name in COLLECTED:
        if name in opts.enabled_checks or name in ("environment", "accelerators"):  # both feed others
            try:
                facts[name] = module(name).collect(opts.to_dict())
            except Exception as exc:  # noqa: BLE001 - a broken probe is a finding, not a dead rank
                facts[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return facts


def worker_main(options: dict[str, Any]) -> int:
    identity = _identity()
    rank, world = identity["rank"], identity["world_size"]
    try:
        opts = PreflightOptions.from_dict(options)
        thresholds = load_thresholds(opts.thresholds)
        if opts.experiment:
            module("experiment").experiment_objects(opts.to_dict())  # a bad model/layout fails here, once
    except (ConfigError, ValueError) as exc:
        if rank == 0:
            print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return ConfigError.exit_code
    if rank in opts.simulate_absent_ranks:  # test hook: behave like a rank whose node never came up
        time.sleep(opts.timeout * 3 + 10)
        return 1
    device = _device(identity)
    facts = {"identity": {**identity, "device": device}, **_collect(opts)}
    try:
        store = rdv.connect(rank, identity["master_addr"], identity["master_port"], opts.timeout)
        rdv.announce(store, rank, facts)
    except rdv.RendezvousError as exc:
        print(f"preflight: {exc}", file=sys.stderr)
        return 1
    if rank != 0:
        return _follower(store, identity, device, opts)
    return _leader(store, identity, device, opts, thresholds)


def _leader(store, identity, device, opts, thresholds) -> int:
    from primus.preflight.report import build_report

    world = identity["world_size"]
    started = time.monotonic()
    joined, missing = rdv.wait_for_announcements(store, world, opts.timeout)
    hosts = {r: f["identity"]["host"] for r, f in joined.items()}
    ctx = Context(world, thresholds, hosts, opts.to_dict())
    findings: list[Finding] = []
    if missing:
        where = rdv.name_missing(missing, hosts, identity["local_world_size"], opts.hosts)
        names = ", ".join(f"rank {r} ({where[r]})" for r in missing)
        findings.append(fail("connectivity", f"{len(missing)} of {world} rank(s) did not join within "
                             f"{opts.timeout:.0f} s: {names}", missing, missing=where))
        rdv.decide(store, {"abort": True, "missing": missing})
        rdv.wait_for_acks(store, len(joined) - 1, 5.0)
        report = build_report(opts, thresholds, ctx, joined, {}, findings, device)
        return _finish(report, opts)
    findings.append(info("connectivity", f"all {world} rank(s) joined in {time.monotonic() - started:.1f} s"))
    rdv.decide(store, {"go": True, "hosts": {str(r): h for r, h in hosts.items()}})
    own = _measure(store, identity, device, opts, hosts)
    rdv.publish_result(store, 0, own)
    results, late = rdv.gather_results(store, world, opts.timeout)
    if late:
        findings.append(fail("connectivity", f"no results within {opts.timeout:.0f} s from "
                             f"{describe_ranks(late, hosts)} (stalled in a test?)", late))
    elif "gemm" in opts.enabled_tests:
        findings.append(_record_profile(device, results, identity["local_world_size"], opts.quick))
    report = build_report(opts, thresholds, ctx, joined, results, findings, device)
    return _finish(report, opts)


def _record_profile(device: str, results: dict[int, Any], local_world: int, quick: bool) -> Finding:
    """Write this host's measured profile for ``primus plan --device local`` (every rank is done)."""
    from primus.preflight.findings import warn
    from primus.preflight.perf.profile import record

    try:
        import torch

        name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
        path = record(device, name, results, local_world, quick=quick)
    except Exception as exc:  # noqa: BLE001 - a profile that cannot be written costs the report nothing
        return warn("performance", f"device profile not written: {type(exc).__name__}: {exc}")
    return info("performance", f"device profile for `primus plan --device local`: {path}")


def _follower(store, identity, device, opts) -> int:
    try:
        decision = rdv.wait_for_decision(store, opts.timeout + 30)
    except rdv.RendezvousError as exc:
        print(f"preflight: rank {identity['rank']}: {exc}", file=sys.stderr)
        return 1
    rdv.acknowledge(store)
    if decision.get("abort"):
        print(f"preflight: rank {identity['rank']} stops: rank 0 reports ranks {decision['missing']} missing",
              file=sys.stderr)
        return 1
    hosts = {int(r): h for r, h in decision["hosts"].items()}
    result = _measure(store, identity, device, opts, hosts)
    rdv.publish_result(store, identity["rank"], result)
    return 1 if result["errors"] else 0


def _groups(hosts: dict[int, str]) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Intra-node groups (the ranks of each host) and inter-node groups (the k-th rank of each host)."""
    by_host: dict[str, list[int]] = {}
    for r in sorted(hosts):
        by_host.setdefault(hosts[r], []).append(r)
    intra = {f"intra:{h}": ranks for h, ranks in by_host.items() if len(ranks) > 1}
    inter = {}
    if len(by_host) > 1:
        for k in range(min(len(v) for v in by_host.values())):
            inter[f"inter:local{k}"] = [ranks[k] for ranks in by_host.values()]
    return intra, inter


def _measure(store, identity, device, opts, hosts) -> dict[str, Any]:
    """This rank's part: process group, monitored barrier, compute and collective tests."""
    import torch.distributed as dist

    from primus.preflight.perf import compute
    from primus.preflight.perf.collectives import default_sizes, run_sweep

    rank, world = identity["rank"], identity["world_size"]
    result: dict[str, Any] = {"rank": rank, "errors": [], "collectives": {}, "groups": {}}
    tests = opts.enabled_tests
    for name, fn in (("gemm", compute.gemm), ("membw", compute.memory_bandwidth)):
        if name in tests:
            try:
                result[name] = fn(device, quick=opts.quick)
            except Exception as exc:  # noqa: BLE001
                result["errors"].append(f"{name}: {type(exc).__name__}: {exc}")
    timeout = timedelta(seconds=opts.timeout)
    pg_store = dist.PrefixStore("pg/", store)  # same store as the rendezvous: no second port
    try:
        backend = "nccl" if device.startswith("cuda") else "gloo"
        dist.init_process_group(backend, store=pg_store, rank=rank, world_size=world, timeout=timeout)
        gloo = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
        dist.monitored_barrier(group=gloo, timeout=timeout, wait_all_ranks=True)
        result["barrier"] = "ok"
    except Exception as exc:  # noqa: BLE001 - monitored_barrier names the stalled ranks in its message
        result["errors"].append(f"process group / barrier: {' '.join(str(exc).split())[:500]}")
        return result
    try:
        intra, inter = _groups(hosts)
        if len(set(hosts.values())) == 1:
            groups = {f"intra:{hosts[0]}": (list(range(world)), None)} if world > 1 else {}
        else:
            groups = {name: (ranks, dist.new_group(ranks, timeout=timeout)) for name, ranks in {**intra, **inter}.items()}
        result["groups"] = {name: ranks for name, (ranks, _) in groups.items()}
        sizes = opts.sizes or default_sizes(device, opts.quick)
        warmup, iters = (1, 5) if opts.quick else (3, 20)
        for op in (t for t in COLLECTIVE_TESTS if t in tests):
            for name, (ranks, group) in groups.items():
                if rank in ranks:
                    result["collectives"][f"{op}|{name}"] = run_sweep(op, sizes, group, device, warmup=warmup, iters=iters)
        if "pairwise" in tests and len(set(hosts.values())) > 1:  # every rank takes part: groups are collective
            from primus.preflight.perf.pairwise import PairRunner, nodes_of, run_pairwise

            runner = PairRunner(nodes_of(hosts), rank, device, max(sizes), warmup=warmup, iters=iters,
                                object_group=gloo)
            result["pairwise"] = run_pairwise(runner, float(load_thresholds(opts.thresholds)["nodes"]["margin"]))
    except Exception as exc:  # noqa: BLE001
        result["errors"].append(f"collectives: {type(exc).__name__}: {' '.join(str(exc).split())[:500]}")
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
    return result


def _finish(report: dict[str, Any], opts: PreflightOptions) -> int:
    from primus.preflight.report import write_report

    paths = write_report(report, opts.report_dir)
    for finding in report["findings"]:
        if finding["level"] != "info":
            print(f"preflight {finding['level']}: [{finding['check']}] {finding['message']}")
    if (report.get("nodes") or {}).get("exclude"):
        print(f"preflight: leave out the bad node(s): {report['nodes']['exclude']}")
    print(f"preflight: {report['status'].upper()} ({report['counts']['fail']} fail, {report['counts']['warn']} warn); "
          f"report: {paths['json']}, {paths['markdown']}, {paths.get('pdf', 'no PDF')}")
    return report["exit_code"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m primus.preflight.worker OPTIONS.json", file=sys.stderr)
        return 2
    with open(argv[0]) as handle:
        return worker_main(json.load(handle))


if __name__ == "__main__":
    sys.exit(main())
