"""The data-parallel places of an AutoModel checkpoint against a run's layout (``nemo_automodel/resume.py``);
the real 2-rank run refused on 1 rank is in tests/data/test_sample_hashes.py."""
from __future__ import annotations

from primus.backends.nemo_automodel.resume import data_position_problem


def test_places_count_data_and_context_parallel_ranks(tmp_path):
    saved = tmp_path / "epoch_0_step_1"
    (saved / "dataloader").mkdir(parents=True)
    for rank in (0, 1):
        (saved / "dataloader" / f"dataloader_dp_rank_{rank}.pt").write_bytes(b"")
    (saved / "model").mkdir()

    def problem(section, world, resuming=True):
        cfg = {"checkpoint": {"checkpoint_dir": str(tmp_path)}, "distributed": section}
        return data_position_problem(cfg, "distributed", world, resuming)

    assert problem({}, 2) is None
    assert problem({"cp_size": 2}, 2) is None  # dp 1 x cp 2: AutoModel keys the states by dp x cp
    assert problem({"tp_size": 2}, 4) is None
    assert "holds the data positions of 2 data-parallel ranks, this run has 1" in problem({}, 1)
    assert "this run has 4" in problem({"dp_size": 4}, 4)
    assert problem({}, 1, resuming=False) is None  # a fresh run restores nothing
