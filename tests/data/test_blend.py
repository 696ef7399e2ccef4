"""``primus.data.blend``: Megatron's ``[weight, path, ...]`` form and megatron-core's draw order, which
TorchTitan's blend follows (its end-to-end mix: tests/backends/torchtitan/test_blend.py)."""
from __future__ import annotations

import pytest

from primus.data.blend import describe_blend, draw_counts, next_source, parse_blend

WEIGHTS = [0.2, 0.3, 0.5]


def test_the_form_is_megatrons_and_bad_forms_say_why():
    assert parse_blend([2, "a", 3, "b", 5, "c"]) == (["a", "b", "c"], pytest.approx(WEIGHTS))
    for bad, reason in [([0.2, "a", 0.3], "must alternate"), (["a", 0.2], "is a weight"),
                        ([0, "a", 0, "b"], "positive sum"), ([-1, "a", 2, "b"], "non-negative")]:
        with pytest.raises(ValueError, match=reason):
            parse_blend(bad)


def test_every_prefix_holds_the_weights_to_within_one_sample():
    for n in range(1, 500):
        counts = draw_counts(WEIGHTS, n)
        assert sum(counts) == n and all(abs(c - w * n) <= 1 for c, w in zip(counts, WEIGHTS)), n
    counts = draw_counts(WEIGHTS, 100)
    assert counts == [20, 30, 50]
    line = describe_blend("train", ["a", "b", "c"], WEIGHTS, counts)
    assert line == "data blend (train, 100 samples): a weight 0.2: 20 samples (20.00%); " \
                   "b weight 0.3: 30 samples (30.00%); c weight 0.5: 50 samples (50.00%)"


def test_the_draw_order_is_megatron_cores():
    """megatron-core's own C++ helper, sample for sample (weights that tie and that do not)."""
    pytest.importorskip("megatron.core")
    import numpy

    from megatron.core.datasets import helpers

    for weights in (WEIGHTS, [0.25, 0.25, 0.5], [0.7, 0.1, 0.15, 0.05]):
        size = 1000
        index, sample_index = numpy.zeros(size, dtype=numpy.int16), numpy.zeros(size, dtype=numpy.int64)
        helpers.build_blending_indices(index, sample_index, numpy.array(weights, dtype=numpy.float64), len(weights),
                                       size, False)
        counts, ours = [0] * len(weights), []
        for _ in range(size):
            ours.append(next_source(weights, counts))
            counts[ours[-1]] += 1
        assert ours == index.tolist(), weights
