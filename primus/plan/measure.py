"""What a rank really holds, counted from its tensors: the yardstick ``primus plan``'s memory model is
checked against (tests/plan/memory_worker.py, benchmarks/plan_memory.py).

- ``storage_bytes``: bytes of the distinct storages under some tensors (a view, a parameter that lives
  in a contiguous buffer, a DTensor's local shard: each storage once, padding included).
- ``SavedForBackward``: the bytes of storages the forward passes allocated that are still alive when a
  backward pass begins, i.e. what autograd (or a checkpoint) keeps for it; the largest over a step
  (with pipeline parallelism, several micro-batches' worth wait for their backward). Every op's new
  output storage is seen through a ``TorchDispatchMode`` and released through a weakref finalizer.
  ``torch.autograd.graph.saved_tensors_hooks`` would miss what a non-reentrant checkpoint keeps
  (TorchTitan's activation checkpointing: torch installs its own, innermost, hooks there) and a
  checkpointed block's inputs (held by the checkpoint, not saved). Counting when a backward pass
  begins leaves out the forward's short-lived temporaries, freed by then, and storages allocated
  during the backward pass (gradients, recomputed activations).
"""
from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any


def _owners(tensor) -> list:
    """The plain tensors that own memory under ``tensor``: a tensor subclass wrapping others (a DTensor's
    local shard, a functional collective's pending result) stands for what it wraps."""
    import torch
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if is_traceable_wrapper_subclass(tensor):
        names, _ = tensor.__tensor_flatten__()
        inner = [getattr(tensor, name) for name in names]
        return [plain for t in inner if isinstance(t, torch.Tensor) for plain in _owners(t)]
    return [tensor]


def _storage(tensor):
    """The storage under a plain tensor, or None (the meta device, a storage not materialised)."""
    if tensor.device.type == "meta":
        return None
    try:
        storage = tensor.untyped_storage()
        storage.data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    return storage


def storage_key(tensor) -> tuple[int, int] | None:
    """(data pointer, bytes) of the storage under ``tensor`` (its first owner); None without one."""
    storage = _storage(_owners(tensor)[0])
    return None if storage is None else (storage.data_ptr(), storage.nbytes())


def _keys(tensors: Iterable[Any]) -> Iterator[tuple[int, int]]:
    for tensor in tensors:
        for plain in _owners(tensor) if tensor is not None else ():
            storage = _storage(plain)
            if storage is not None and storage.nbytes():
                yield storage.data_ptr(), storage.nbytes()


def storage_bytes(tensors: Iterable[Any], exclude: set[int] | None = None) -> int:
    """Bytes of the distinct storages under ``tensors`` (those whose pointer is in ``exclude`` left out)."""
    return sum(dict(key for key in _keys(tensors) if key[0] not in (exclude or ())).values())


def storage_pointers(tensors: Iterable[Any]) -> set[int]:
    return {pointer for pointer, _ in _keys(tensors)}


class SavedForBackward:
    """``with SavedForBackward(known) as saved: <forward and backward passes>``; then ``saved.peak`` (bytes).

    ``known``: pointers of storages that exist before (parameters, gradient buffers): an op whose output
    is a view of one of them allocates nothing. ``paused()``: allocations inside are not activations
    (FSDP's all-gathered parameters)."""

    def __init__(self, known: set[int] | None = None):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        tracker = self
        self.known = set(known or ())
        self.live: dict[int, int] = {}  # pointer -> bytes, storages allocated in a forward pass, alive
        self.current = 0
        self.peak = 0
        self._paused = 0
        self._in_backward = False

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                backward = torch._C._current_graph_task_id() != -1
                if backward and not tracker._in_backward:  # a backward pass begins: what is kept for it
                    tracker.peak = max(tracker.peak, tracker.current)
                tracker._in_backward = backward
                out = func(*args, **(kwargs or {}))
                if not backward and not tracker._paused:
                    tracker._seen(out, args, kwargs)
                return out

        self._mode = _Mode()

    def _seen(self, out, args, kwargs) -> None:
        import torch
        from torch.utils._pytree import tree_leaves

        inputs = None
        for tensor in (plain for leaf in tree_leaves(out) if isinstance(leaf, torch.Tensor) for plain in _owners(leaf)):
            storage = None if tensor._is_view() else _storage(tensor)
            if storage is None:
                continue
            pointer, size = storage.data_ptr(), storage.nbytes()
            if not size or pointer in self.live or pointer in self.known:
                continue
            if inputs is None:  # an in-place or out= op returns an input's storage: nothing new
                inputs = storage_pointers(t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
            if pointer in inputs:
                continue
            self.live[pointer] = size
            self.current += size
            weakref.finalize(storage, self._freed, pointer)

    def _freed(self, pointer: int) -> None:
        self.current -= self.live.pop(pointer, 0)

    @contextmanager
    def paused(self) -> Iterator[None]:
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def __enter__(self) -> "SavedForBackward":
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
