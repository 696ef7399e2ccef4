"""Distributed-checkpoint collectives on a short-lived gloo group, so a save leaves no OpenMP pools.

Why (root-caused on torch 2.13 CPU wheels, which use libgomp): ``torch.distributed.checkpoint``
``save``/``load`` gather every rank's plan with ``gather_object``/``all_gather_object``. On a gloo
group the gathered bytes are copied by ATen ops *on the group's worker threads*
(``pt_gloo_runloop``); a copy above ATen's grain size (32 KiB) is an OpenMP parallel region, so
each worker thread that runs one becomes the master of its own OpenMP thread pool, kept for the
life of that thread, i.e. of the process group. From then on libgomp manages more threads than
there are CPUs, and it switches every OpenMP worker from spin-waiting between parallel regions
(~3 ms, ``GOMP_SPINCOUNT``) to its throttled count (100 spins): the intra-op worker now sleeps
after each of the hundreds of parallel regions in a training step and is woken by a futex for the
next. Measured on the tiny TorchTitan demo (2 cores, 2 intra-op threads): after the first
checkpoint two more threads live in the process (OpenMP workers under the default group's two
gloo threads), the intra-op worker's voluntary context switches go from ~5 to ~500 per step, and
every later step takes 1.7-2x as long. With one intra-op thread there are no pools at all, which
is why ``OMP_NUM_THREADS=1`` hid it, and a save whose plans stay under 32 KiB (a small
``nn.Sequential``) never triggers it. NeMo AutoModel's checkpointer (same DCP calls) shows the
same two extra pools; Megatron's ``dist_checkpointing`` on one rank does not.

The fix: run each save/load on its own gloo group and destroy the group afterwards. Its worker
threads exit, and libgomp's thread destructor takes their pools (and its count of managed
threads) with them. Creating a one-member-per-rank gloo group costs milliseconds next to a save.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any


@contextmanager
def transient_gloo_group() -> Iterator[Any]:
    """A fresh gloo group for one checkpoint's collectives (``None`` where none is needed:
    no process group, a non-gloo default group, or one intra-op thread, which makes no pools).
    Every rank must enter it together, as they do for a checkpoint save or load."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_backend() != "gloo" \
            or torch.get_num_threads() <= 1:
        yield None
        return
    group = dist.new_group(backend="gloo")
    try:
        yield group
    finally:
        dist.destroy_process_group(group)


class DCPOnTransientGroup:
    """Stands in for the ``torch.distributed.checkpoint`` module inside an engine's checkpointer:
    ``save`` and ``load`` called without a ``process_group`` run on a transient gloo group; every
    other attribute (``async_save``, the storage writers, ...) is the real module's."""

    def __init__(self, module: ModuleType):
        self.module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)

    def save(self, *args: Any, **kwargs: Any) -> Any:
        return self._on_own_group(self.module.save, args, kwargs)

    def load(self, *args: Any, **kwargs: Any) -> Any:
        return self._on_own_group(self.module.load, args, kwargs)

    @staticmethod
    def _on_own_group(call: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        if kwargs.get("process_group") is not None:
            return call(*args, **kwargs)  # the engine chose a group: leave it alone
        with transient_gloo_group() as group:
            if group is not None:
                kwargs = {**kwargs, "process_group": group}
            return call(*args, **kwargs)


def route_dcp_through_transient_groups(engine_module: ModuleType) -> None:
    """Point ``engine_module.dcp`` (its ``import torch.distributed.checkpoint as dcp``) at a
    ``DCPOnTransientGroup``; idempotent."""
    current = engine_module.dcp
    if not isinstance(current, DCPOnTransientGroup):
        engine_module.dcp = DCPOnTransientGroup(current)
