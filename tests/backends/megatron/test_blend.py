"""Megatron blends: ``data_path: [0.2, a, 0.3, b, 0.5, c]`` over three indexed corpora built locally.
megatron-core's ``BlendedMegatronDatasetBuilder`` decides the mix; the run's log states it (from the
built dataset's ``dataset_index``, the order the run reads), and the first N samples the run trains
on hold the weights to within 2%."""
from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.e2e  # every test here starts Primus or an engine in another process

pytest.importorskip("megatron.core")

STEPS = 2  # the ``base`` fixture's train_iters
WEIGHTS = [0.2, 0.3, 0.5]
GLOBAL_BATCH = 64


@pytest.fixture(scope="module")
def blended(tiny_assets, tmp_path_factory):
    """The tiny corpus dealt into three JSONL files (no document in two), each built into .bin/.idx."""
    from primus.data.indexed import build_indexed_dataset

    root = tmp_path_factory.mktemp("blend")
    lines = tiny_assets["corpus_file"].read_text().splitlines()
    prefixes = []
    for k, name in enumerate("abc"):
        (root / f"{name}.jsonl").write_text("\n".join(lines[k::3]) + "\n")
        build_indexed_dataset(root / f"{name}.jsonl", tiny_assets["tokenizer"], root / f"{name}_text_document")
        prefixes.append(str(root / f"{name}_text_document"))
    return prefixes


def test_the_run_draws_the_blend_it_states(runs, blended):
    data_path = [x for w, p in zip(WEIGHTS, blended) for x in (str(w), p)]
    records = runs("blend", 1, data_path=data_path, global_batch_size=GLOBAL_BATCH, micro_batch_size=8,
                   eval_interval=2, eval_iters=1)
    assert [r["step"] for r in records] == [1, 2]
    log = (runs.root / "blend" / "output.log").read_text()
    train = next(line for line in log.splitlines() if f"data blend (train, {STEPS * GLOBAL_BATCH} samples)" in line)
    counts = [int(re.search(re.escape(prefix) + r" weight [\d.]+: (\d+) samples", train).group(1)) for prefix in blended]
    assert sum(counts) == STEPS * GLOBAL_BATCH
    assert [c / sum(counts) for c in counts] == pytest.approx(WEIGHTS, abs=0.02), train
    assert "data blend (valid, " in log  # split 98,2,0: the validation split is blended too
