"""The torch_dist writer count comes from Megatron-LM's ``dist_ckpt_workers`` (default 1; megatron-core's
strategy defaults to two). Each writer is a process megatron-core forks per save; the first save's results
queue is ``patch_checkpoint_results_queue_by_fork``'s (test_startup_patches.py).
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("megatron.core")


@pytest.mark.parametrize("workers", [1, 4])
def test_the_writer_count_is_dist_ckpt_workers(workers):
    from primus.backends.megatron.checkpoint import _save_strategy

    assert _save_strategy(SimpleNamespace(dist_ckpt_workers=workers)).thread_count == workers


def test_megatron_lm_default_is_one_writer_and_the_key_is_implemented():
    from primus.backends.megatron import support
    from primus.backends.megatron.megatron_lm_args import ROWS

    default = next(row[3] for row in ROWS if row[0] == "dist_ckpt_workers")
    assert default == 1
    assert "dist_ckpt_workers" in support.IMPLEMENTED and "dist_ckpt_workers" not in support.KERNEL_ONLY
