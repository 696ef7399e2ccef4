"""``primus: {sample_hashes: true}``: a short digest of each step's global batch, ``sample_hash`` in
every step row of metrics.jsonl, so that two runs can be shown to have consumed the same samples
in the same order (an interrupted and resumed run against an uninterrupted one).

Each rank digests the samples it fed (8 bytes of BLAKE2b per sample, over its token ids or
latents), keyed by the sample's place in the global batch: Megatron's global sample index; a
loader that deals one global order round-robin (TorchTitan's ``dataloader.reshardable``) the place
in that order; else (data-parallel rank, order of arrival). At the step's end every rank hands its keys and digests to
all the others (``all_gather_object``: a few bytes per sample); duplicates from tensor-, pipeline-
or context-parallel ranks, which feed the same samples, collapse; the digests, ordered by key, are
digested again. With global keys (the first two) the hash does not depend on how many ranks fed it.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any, Callable


def sample_digest(row: Any) -> bytes:
    """8 bytes of BLAKE2b over one sample's values (a tensor row, any dtype, any device)."""
    import torch

    flat = row.detach().reshape(-1).contiguous().cpu()
    return hashlib.blake2b(flat.view(torch.uint8).numpy().tobytes(), digest_size=8).digest()


class BatchDigest:
    """What this rank fed since the last ``finish``: ``{key: digest}``."""

    def __init__(self, rank: int = 0):
        self.rank = rank
        self._samples: dict[tuple[int, ...], bytes] = {}
        self._arrived = 0  # rows recorded without a global key since the last finish

    def add(self, rows: Any, keys: Iterable[int | tuple[int, ...]] | None = None, *, group_rank: int | None = None,
            dealt_over: int | None = None) -> None:
        """The rows (``[n, ...]``) of one micro-batch; ``keys``: their global sample indices, or
        None: (``group_rank``, order of arrival), ``group_rank`` the data-parallel rank; with
        ``dealt_over`` (the data-parallel degree of a round-robin loader, whose rank r takes samples
        r, r + degree, ...) the place in the step's global order, ``group_rank + degree * arrival``."""
        if keys is None:
            first, rank = self._arrived, self.rank if group_rank is None else group_rank
            self._arrived += len(rows)
            arrivals = range(first, first + len(rows))
            keys = [rank + dealt_over * i for i in arrivals] if dealt_over else [(rank, i) for i in arrivals]
        for key, row in zip(keys, rows):
            self._samples.setdefault(key if isinstance(key, tuple) else (key,), sample_digest(row))

    def recorded(self, batches: Iterable[Any], rows: Callable[[Any], Any], group_rank: int,
                 dealt_over: int | None = None) -> Iterator[Any]:
        """``batches`` unchanged, each one's ``rows(batch)`` added as it is taken (``add``'s keys)."""
        for batch in batches:
            self.add(rows(batch), group_rank=group_rank, dealt_over=dealt_over)
            yield batch

    def finish(self) -> str:
        """The hex digest of the global batch since the last call; a collective: every rank calls it."""
        import torch.distributed as dist

        local, self._samples, self._arrived = self._samples, {}, 0
        merged: dict[tuple[int, ...], bytes] = {}
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            everyone: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, sorted(local.items()))
            for items in everyone:
                for key, digest in items:
                    merged.setdefault(tuple(key), digest)
        else:
            merged = local
        total = hashlib.blake2b(digest_size=8)
        for key in sorted(merged):
            total.update(merged[key])
        return total.hexdigest()
