"""Step probe, loaded by the benchmark harness in BOTH the Primus run and the bare-engine run.

Put on ``PYTHONPATH`` (as ``sitecustomize``) with ``BENCH_PROBE_DIR`` set. When
``torch.optim.optimizer`` is imported it registers torch's *global* optimizer step post-hook,
which fires after every ``torch.optim.Optimizer.step`` of every engine (TorchTitan's
``OptimizersContainer`` -> AdamW, Megatron's wrapper -> AdamW, AutoModel -> AdamW). Each
firing appends ``rank kind optimizer_id wall_time perf_counter max_rss_kb threads`` to a per-process
file (``threads``: how many threads the process has, for ``benchmarks.checkpoint_steady``: an
OpenMP pool left behind by a checkpoint shows there). The harness turns consecutive step ends into step times, so Primus and the bare engine
are timed by the same code at the same point: the whole loop iteration (data, forward,
backward, optimizer, the engine's and Primus's logging/metrics) between two optimizer steps.
Nothing is imported or patched when ``BENCH_PROBE_DIR`` is unset.
"""
import os

_DIR = os.environ.get("BENCH_PROBE_DIR")

if _DIR:
    import importlib.abc
    import importlib.machinery
    import resource
    import sys
    import time

    _TARGET = "torch.optim.optimizer"
    _PROC = os.path.isdir("/proc/self/task")
    _WAKEUPS = _PROC and os.environ.get("BENCH_PROBE_WAKEUPS") == "1"

    def _wakeups() -> int:
        """Voluntary context switches of all threads but the main one: OpenMP workers that sleep
        between parallel regions instead of spinning show up here (checkpoint_steady)."""
        total, main = 0, str(os.getpid())
        for tid in os.listdir("/proc/self/task"):
            if tid == main:
                continue
            try:
                with open(f"/proc/self/task/{tid}/status") as status:
                    total += next(int(line.split()[1]) for line in status if line.startswith("voluntary_ctxt"))
            except (OSError, StopIteration):
                pass
        return total
    _file = None

    def _hook(optimizer, args, kwargs):
        global _file
        if _file is None:
            os.makedirs(_DIR, exist_ok=True)
            _file = open(os.path.join(_DIR, f"steps-{os.getpid()}.txt"), "a", buffering=1)
        kind = f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"
        _file.write(f"{os.environ.get('RANK', '0')} {kind} {id(optimizer)} {time.time():.6f} "
                    f"{time.perf_counter():.6f} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} "
                    f"{len(os.listdir('/proc/self/task')) if _PROC else 0} {_wakeups() if _WAKEUPS else 0}\n")

    class _Loader(importlib.abc.Loader):
        def __init__(self, inner):
            self.inner = inner

        def create_module(self, spec):
            return self.inner.create_module(spec)

        def exec_module(self, module):
            self.inner.exec_module(module)
            module.register_optimizer_step_post_hook(_hook)

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != _TARGET:
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
            return spec

    sys.meta_path.insert(0, _Finder())
