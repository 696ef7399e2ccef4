"""Weighted blends of datasets: Megatron's ``[weight, path, weight, path, ...]`` form, the order in
which a blend draws from its datasets, and the log line that says what a run drew.

The draw order is megatron-core's ``build_blending_indices`` (megatron/core/datasets/helpers.cpp,
megatron-core 0.16.1): sample i comes from the dataset whose count lags its share of max(i, 1) the
most, first dataset on ties. Any prefix of the order is then within about one sample of the weights.
Megatron runs use megatron-core's own; TorchTitan's blend (``backends/torchtitan/data.py``) this one.
"""
from __future__ import annotations

from collections.abc import Sequence


def parse_blend(entries: Sequence[object]) -> tuple[list[str], list[float]]:
    """``(paths, weights)`` of ``[w1, path1, w2, path2, ...]``, weights normalized to sum 1; ValueError
    saying what is wrong."""
    entries = list(entries)
    if len(entries) < 2 or len(entries) % 2:
        raise ValueError(f"weights and paths must alternate, [0.3, path_a, 0.7, path_b] (got {entries!r})")
    try:
        weights = [float(w) for w in entries[0::2]]  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"every other entry, from the first, is a weight (got {entries[0::2]!r})") from None
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"weights must be non-negative with a positive sum (got {weights})")
    total = sum(weights)
    return [str(p) for p in entries[1::2]], [w / total for w in weights]


def next_source(weights: Sequence[float], counts: Sequence[int]) -> int:
    """The dataset the next sample comes from, given how many each has given (megatron-core's rule)."""
    drawn = max(float(sum(counts)), 1.0)
    errors = [w * drawn - c for w, c in zip(weights, counts)]
    return errors.index(max(errors))


def draw_counts(weights: Sequence[float], samples: int) -> list[int]:
    """How many of the first ``samples`` samples each dataset gives."""
    counts = [0] * len(weights)
    for _ in range(samples):
        counts[next_source(weights, counts)] += 1
    return counts


def describe_blend(split: str, paths: Sequence[str], weights: Sequence[float], counts: Sequence[int]) -> str:
    """One log line: the blend and what each dataset gives of the split's samples."""
    total = sum(counts)
    parts = [f"{path} weight {w:.4g}: {n} samples ({n / max(total, 1):.2%})"
             for path, w, n in zip(paths, weights, counts)]
    return f"data blend ({split}, {total} samples): " + "; ".join(parts)
