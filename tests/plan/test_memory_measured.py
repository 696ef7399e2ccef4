"""The plan's memory per rank against what the engines really allocate: each layout of
tests/plan/memory_cases.py built through Primus's own backend code on 1, 2 or 4 CPU ranks, one step, the
rank's tensors counted (primus.backends.<engine>.memory). Weights, gradients and optimizer state within
1% (they agree to the byte), activations within 10% (docs/plan.md: the residuals)."""
from __future__ import annotations

import pytest

from tests.plan.memory_cases import CASES, STATIC, measure, planned, residuals

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def measured(tmp_path_factory, tiny_cache):
    pytest.importorskip("megatron.core")
    pytest.importorskip("torchtitan")
    assets = tiny_cache / "tiny_llm"
    return assets, measure(list(CASES), tmp_path_factory.mktemp("memory"), assets)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_plan_matches_the_ranks(case, measured):
    assets, results = measured
    rows = residuals(case, planned(case, assets), results[case.name])
    static = [r for r in rows if r.component in STATIC]
    assert static and all(abs(r.relative) <= 0.01 for r in static), [r for r in static if abs(r.relative) > 0.01]
    activations = [r for r in rows if r.component == "activations"]
    assert all(abs(r.relative) <= 0.10 for r in activations), activations


def test_enough_layouts_per_backend():
    counts = {"megatron": 0, "torchtitan": 0}
    for case in CASES:
        counts["megatron" if "megatron" in case.exp else "torchtitan"] += 1
    assert min(counts.values()) >= 6 and {case.world for case in CASES} == {1, 2, 4}
