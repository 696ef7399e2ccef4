"""keep_primus_logging: AutoModel's setup_logging must not take over Primus's logging."""
from __future__ import annotations

import logging

import pytest

from primus.backends.nemo_automodel.patches import keep_primus_logging


def _setup_logging_on_rank_1(monkeypatch):
    from nemo_automodel.components.loggers.log_utils import setup_logging

    monkeypatch.setenv("RANK", "1")
    setup_logging()
    logging.getLogger("primus.probe").warning("first record on rank 1")  # RankFilter fires here


def test_upstream_setup_logging_silences_rank_1(monkeypatch):
    """The upstream behaviour the patch exists for (fails once AutoModel stops doing it)."""
    handler = logging.StreamHandler()
    formatter = logging.Formatter("PRIMUS %(message)s")
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        _setup_logging_on_rank_1(monkeypatch)
        assert logging.root.manager.disable == logging.CRITICAL
        assert handler.formatter is not formatter
    finally:
        root.removeHandler(handler)
        logging.disable(logging.NOTSET)
        for lg in [root, *logging.root.manager.loggerDict.values()]:
            for f in list(getattr(lg, "filters", [])):
                if type(f).__name__ == "RankFilter":
                    lg.removeFilter(f)


def test_keep_primus_logging_restores_state(monkeypatch, caplog):
    handler = logging.StreamHandler()
    formatter = logging.Formatter("PRIMUS %(message)s")
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with keep_primus_logging():
            _setup_logging_on_rank_1(monkeypatch)
        assert logging.root.manager.disable == logging.NOTSET
        assert handler.formatter is formatter
        with caplog.at_level(logging.INFO):
            logging.getLogger("primus.after").info("still heard on rank 1")
        assert "still heard on rank 1" in caplog.text
    finally:
        root.removeHandler(handler)
        logging.disable(logging.NOTSET)


def test_one_train_line_drops_only_the_engine_train_record(caplog):
    from primus.backends.nemo_automodel.patches import one_train_line

    with caplog.at_level(logging.INFO), one_train_line():
        logging.info("[TRAIN] step=0 epoch=0 loss=1.0")  # AutoModel's, on the root logger
        logging.info("[INFO] Epoch 1 complete")
        logging.getLogger("primus.metrics").info("[TRAIN] step=1 loss=1.0")
    assert "step=0" not in caplog.text
    assert "Epoch 1 complete" in caplog.text and "[TRAIN] step=1" in caplog.text


def _draw_after_restoring_a_loader() -> "torch.Tensor":
    """The first random number after an iterator is rebuilt from a saved state, the RNG seeded just before."""
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(list(range(4)), batch_size=1)
    iterator = iter(loader)
    next(iterator)
    resumed = StatefulDataLoader(list(range(4)), batch_size=1)
    resumed.load_state_dict(loader.state_dict())
    torch.manual_seed(0)
    rest = [int(batch) for batch in iter(resumed)]
    assert rest == [1, 2, 3]  # the position itself is restored either way
    return torch.rand(1)


def test_restored_loader_keeps_the_rng():
    """Upstream, rebuilding the iterator draws from the global RNG (the first assert fails once torchdata
    stops); under the patch the next draw is the one the restored RNG state gives."""
    import torch

    from primus.backends.nemo_automodel.patches import restored_loader_keeps_the_rng
    from primus.runtime.patches import Swaps

    torch.manual_seed(0)
    expected = torch.rand(1)
    assert not _draw_after_restoring_a_loader().equal(expected)
    swap = Swaps()
    restored_loader_keeps_the_rng(swap)
    try:
        assert _draw_after_restoring_a_loader().equal(expected)
    finally:
        swap.restore()
    assert not _draw_after_restoring_a_loader().equal(expected)


COMPILE_PROBE = """
import sys, torch
{first}
import nemo_automodel.recipes.llm.train_ft, nemo_automodel.recipes.diffusion.train
print("inductor imported:", "torch._inductor.compile_fx" in sys.modules, "compile restored:", torch.compile.__module__)
"""


@pytest.mark.e2e
def test_compile_on_first_call_keeps_inductor_out_of_automodels_import():
    """AutoModel's import-time ``@torch.compile`` decorators import Inductor (upstream); through
    ``primus.backends.nemo_automodel`` they compile on first call and ``torch.compile`` is torch's again."""
    import subprocess
    import sys

    import torch

    if torch.cuda.is_available():
        pytest.skip("applied on hosts without a GPU")

    def probe(first: str) -> str:
        result = subprocess.run([sys.executable, "-c", COMPILE_PROBE.format(first=first)], capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout

    assert "inductor imported: True" in probe("")
    assert "inductor imported: False compile restored: torch" in probe("import primus.backends.nemo_automodel")


def test_eager_float32_rms_norm_runs_the_same_op_without_compiling():
    """AutoModel's fp32 RMSNorm compiles one opaque custom op (upstream: Dynamo traces it on the first call);
    patched, the module calls that op eagerly: no frame compiled, the op's own output and gradients; undone,
    the compiled function is back."""
    import torch
    from torch._dynamo.utils import counters
    from nemo_automodel.components.models.common import utils

    from primus.backends.nemo_automodel.patches import eager_float32_rms_norm
    from primus.runtime.patches import Swaps

    compiled = utils._float32_rms_norm_fwd
    torch.manual_seed(0)
    norm = utils.Float32RMSNorm(16, eps=1e-5, dtype=torch.float32)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(3, 5, 16, requires_grad=True)
    reference = x.detach().clone().requires_grad_()
    frames = counters["frames"]["total"]
    swap = Swaps()
    eager_float32_rms_norm(swap)
    try:
        out = norm(x)
        out.square().sum().backward()
    finally:
        swap.restore()
    assert counters["frames"]["total"] == frames  # nothing compiled
    assert utils._float32_rms_norm_fwd is compiled
    expected = torch.ops.nemo_automodel.float32_rms_norm(reference, norm.weight.detach(), 1e-5)
    expected.square().sum().backward()
    assert torch.equal(out.detach(), expected.detach()) and torch.equal(x.grad, reference.grad)
    assert norm.weight.grad is not None and torch.isfinite(norm.weight.grad).all()
