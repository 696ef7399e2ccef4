"""megatron-core's fixed costs on a CPU host, with and without Primus's two startup patches, side by side.

- ``import``: a fresh interpreter imports megatron-core's model, optimizer and DDP modules, as a rank
  (or a launcher checking admission) does: plain, and after ``import primus.backends.megatron``
  (``patch_lazy_fusion_compile``: the ~40 ``jit_fuser`` functions compile on first call). CPU seconds
  of the child, and whether TorchDynamo / Inductor were imported.
- ``first save queue``: what a rank's first torch_dist save pays for its results queue: start
  megatron-core's multiprocessing Manager and put one set of write results through it, with the
  spawn method (upstream) and forked (``patch_checkpoint_results_queue_by_fork``). Wall seconds.

Interleaved rounds (each variant once per round) so load drift hits both. ``python -m
benchmarks.megatron_startup [--reps N]``; JSON in benchmarks/results/megatron_startup.json.
"""
from __future__ import annotations

import argparse
import resource
import subprocess
import time
from typing import Any

from benchmarks.common import PY, REPO, fmt, machine, md_table, save, spread

IMPORT = """
import sys
{first}
import megatron.core, megatron.core.models.gpt, megatron.core.optimizer, megatron.core.distributed
print("dynamo" if "torch._dynamo" in sys.modules else "-", "inductor" if "torch._inductor.compile_fx" in sys.modules else "-")
"""

QUEUE = """
import multiprocessing, time
import torch
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.storage import WriteResult

if __name__ == "__main__":
    results = [WriteResult(index=MetadataIndex(f"w{{i}}"), size_in_bytes=4, storage_data=_StorageInfo("f", 0, 4))
               for i in range(8)]
    start = time.perf_counter()
    queue = multiprocessing.get_context("{method}").Manager().Queue()
    queue.put(results)
    assert queue.get() == results
    print(round(time.perf_counter() - start, 4))
"""


def _child(code: str) -> tuple[float, float, str]:
    """(wall s, CPU s of the child and its children, its stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([PY, "-W", "ignore", "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc.stdout.strip()


def run(reps: int) -> dict[str, Any]:
    variants = {
        "import megatron-core (upstream)": IMPORT.format(first=""),
        "import megatron-core (primus.backends.megatron first)": IMPORT.format(first="import primus.backends.megatron"),
        "first save queue (spawned Manager, upstream)": QUEUE.format(method="spawn"),
        "first save queue (forked Manager)": QUEUE.format(method="fork"),
    }
    walls: dict[str, list[float]] = {name: [] for name in variants}
    cpus: dict[str, list[float]] = {name: [] for name in variants}
    said: dict[str, str] = {}
    for _ in range(reps):
        for name, code in variants.items():
            wall, cpu, out = _child(code)
            walls[name].append(float(out) if name.startswith("first save") else wall)
            cpus[name].append(cpu)
            said[name] = out
    rows = {name: {"wall_s": spread(walls[name]), "cpu_s": spread(cpus[name]),
                   "compilers_imported": said[name] if name.startswith("import") else None} for name in variants}
    names = list(variants)
    ratios = {"import_cpu_upstream_over_patched": rows[names[0]]["cpu_s"]["median"] / rows[names[1]]["cpu_s"]["median"],
              "queue_wall_spawn_over_fork": rows[names[2]]["wall_s"]["median"] / rows[names[3]]["wall_s"]["median"]}
    return {"reps": reps, "machine": machine(), "variants": rows, "ratios": ratios}


def markdown(results: dict[str, Any]) -> str:
    rows = [[name, fmt(r["wall_s"]["median"]), fmt(r["cpu_s"]["median"]), r["compilers_imported"] or ""]
            for name, r in results["variants"].items()]
    ratios = results["ratios"]
    return (md_table(["variant", "median wall (s)", "median CPU (s)", "compilers imported"], rows)
            + f"\n\nimport CPU, upstream / patched: {ratios['import_cpu_upstream_over_patched']:.2f}x; "
              f"first save queue wall, spawn / fork: {ratios['queue_wall_spawn_over_fork']:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    results = run(parser.parse_args().reps)
    print(markdown(results))
    print(f"results: {save('megatron_startup', results)}")


if __name__ == "__main__":
    main()
