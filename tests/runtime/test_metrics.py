import importlib.util
import json

import pytest

from primus.plan.model import ModelSpec
from primus.plan.devices import device_key, peak_tflops
from primus.plan.flops import dense_decoder_flops_per_token
from primus.runtime.metrics import StepReport, derive, format_train_line
from primus.runtime.reporter import MetricsReporter
from tests.conftest import SEED_TRAIN_LINE


def test_rates_are_derived_from_the_step_report():
    m = derive(StepReport(step=3, loss=2.5, step_time_s=0.5, samples=8, tokens=1024, flops=4e12),
               world_size=2, device="cpu", peak_tflops=None)
    assert (m.samples_per_sec, m.samples_per_sec_per_gpu, m.tokens_per_sec) == (16.0, 8.0, 2048.0)
    assert m.tflops == pytest.approx(4.0)  # 4e12 flops / 0.5 s / 2 ranks
    assert m.mfu is None  # unknown peak on CPU: n/a, not invented
    assert m.mem_gb > 0  # peak RSS on CPU
    line = format_train_line(m)
    assert SEED_TRAIN_LINE.match(line), line
    assert line.startswith("[TRAIN] step=3 loss=2.5000 step_time=0.500s samples_per_sec=16.00 "
                           "samples_per_sec_per_gpu=8.00 mem=")
    assert line.endswith("GB tokens_per_sec=2048.0 tflops=4.0000 mfu=n/a")


def test_train_line_keeps_the_seed_fields_first_then_extras():
    m = derive(StepReport(step=7, loss=float("nan"), step_time_s=2.0, samples=4, lr=3e-4, grad_norm=1.5,
                          extra={"load_balancing_loss": 0.0123, "micro_batches": 2, "note": "text"}),
               world_size=4, device="cpu", peak_tflops=None)
    line = format_train_line(m)
    assert SEED_TRAIN_LINE.match(line), line  # a NaN loss still parses
    tail = line.split("GB ", 1)[1]
    assert tail == "tokens_per_sec=n/a tflops=n/a mfu=n/a lr=0.0003 grad_norm=1.5000 load_balancing_loss=0.0123 " \
                   "micro_batches=2"  # non-numeric extras stay in metrics.jsonl only


def test_mfu_against_a_known_peak():
    m = derive(StepReport(step=1, loss=1.0, step_time_s=1.0, samples=1, flops=989e12 * 8 / 2),
               world_size=8, device="cpu", peak_tflops=peak_tflops("NVIDIA H100 80GB HBM3"))
    assert m.mfu == pytest.approx(0.5)


def test_peak_table_and_override(monkeypatch):
    assert device_key("AMD Instinct MI300X") == "mi300x"
    assert device_key("AMD Instinct MI355X") == "mi355x"
    assert peak_tflops("cpu") is None
    assert peak_tflops("cpu", override=1.5) == 1.5
    monkeypatch.setenv("PRIMUS_PEAK_TFLOPS", "2.0")
    assert peak_tflops("cpu") == 2.0


def test_flops_formula_by_hand():
    spec = ModelSpec(n_layers=2, dim=128, n_heads=4, n_kv_heads=2, multiple_of=32, vocab_size=512)
    # attention: q,o 128x128 each; k,v 128x64 each; mlp 3 x 128x352; head 128x512
    per_layer = 2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 352
    assert spec.matmul_params() == 2 * per_layer + 128 * 512
    assert dense_decoder_flops_per_token(n_layers=2, dim=128, seq_len=64, matmul_params=spec.matmul_params()) == \
        6 * spec.matmul_params() + 6 * 2 * 64 * 128


def test_param_count_matches_torchtitan_exactly():
    pytest.importorskip("torchtitan")
    from primus.backends.torchtitan.patches import apply_patches

    apply_patches()
    import torch

    from primus.backends.torchtitan.model import build_model_spec

    for spec in [ModelSpec(n_layers=2, dim=128, n_heads=4, n_kv_heads=2, multiple_of=32, vocab_size=512),
                 ModelSpec(n_layers=3, dim=96, n_heads=6, ffn_hidden_size=200, vocab_size=300)]:
        with torch.device("meta"):
            model = build_model_spec(spec, "sdpa").model.build()
        assert sum(p.numel() for p in model.parameters()) == spec.total_params()


def test_reporter_writes_jsonl_on_rank0_only(tmp_path):
    reporter = MetricsReporter(tmp_path, rank=0, world_size=1, device="cpu", peak_tflops=None,
                               enable_tensorboard=False)
    reporter.report(StepReport(step=1, loss=3.0, step_time_s=0.1, samples=4))
    reporter.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 1 and rows[0]["loss"] == 3.0 and rows[0]["tokens_per_sec"] is None
    other = tmp_path / "r1"
    other.mkdir()
    MetricsReporter(other, rank=1, world_size=2, device="cpu", peak_tflops=None).report(
        StepReport(step=1, loss=3.0, step_time_s=0.1, samples=4))
    assert not (other / "metrics.jsonl").exists()



def test_tensorboard_events_hold_every_scalar_per_step(tmp_path):
    """One event per step carries all scalars; TensorBoard's own reader sees each tag's series."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    reporter = MetricsReporter(tmp_path, rank=0, world_size=1, device="cpu", peak_tflops=None)
    for step in (1, 2, 3):
        reporter.report(StepReport(step=step, loss=4.0 - step, step_time_s=0.5, samples=2, tokens=512, lr=1e-3))
    reporter.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert {"train/loss", "train/tokens_per_sec", "train/lr", "train/step_time"} <= set(events.Tags()["scalars"])
    assert "train/tflops" not in events.Tags()["scalars"]  # None values are left out, not written as 0
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 3.0), (2, 2.0), (3, 1.0)]
    assert [e.value for e in events.Scalars("train/tokens_per_sec")] == [1024.0] * 3


@pytest.mark.parametrize("loss", [float("nan"), float("inf")])
def test_a_non_finite_loss_stops_the_run_after_it_is_recorded(tmp_path, loss):
    import logging

    from primus.runtime.context import NonFiniteLoss, RunContext
    from primus.runtime.metrics import StepReport
    from primus.runtime.reporter import MetricsReporter

    reporter = MetricsReporter(tmp_path, rank=0, world_size=1, device="cpu", peak_tflops=None, enable_tensorboard=False)
    ctx = RunContext(run_dir=tmp_path, rank=0, local_rank=0, world_size=1, device="cpu",
                     logger=logging.getLogger("t"), reporter=reporter)
    ctx.report_step(StepReport(step=1, loss=2.0, step_time_s=0.1, samples=1))
    with pytest.raises(NonFiniteLoss, match="at step 2"):
        ctx.report_step(StepReport(step=2, loss=loss, step_time_s=0.1, samples=1))
    reporter.close()
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2  # the bad step is on record
    ctx.stop_on_non_finite_loss = False
    ctx.reporter = MetricsReporter(tmp_path, rank=0, world_size=1, device="cpu", peak_tflops=None,
                                   enable_tensorboard=False)
    ctx.report_step(StepReport(step=3, loss=loss, step_time_s=0.1, samples=1))  # asked to continue


def test_a_validation_pass_takes_the_metrics_path(tmp_path, caplog):
    """One [EVAL] formatter; a "kind": "eval" row in metrics.jsonl; eval/* scalars in TensorBoard."""
    import logging
    import math

    from primus.runtime.metrics import EvalReport, is_step_row

    reporter = MetricsReporter(tmp_path, rank=0, world_size=1, device="cpu", peak_tflops=None,
                               enable_tensorboard=importlib.util.find_spec("tensorboard") is not None)
    with caplog.at_level(logging.INFO, logger="primus.metrics"):
        reporter.report(StepReport(step=1, loss=3.0, step_time_s=0.1, samples=4))
        reporter.report_eval(EvalReport(step=1, loss=2.0))
        reporter.report_eval(EvalReport(step=1, loss=800.0, name="squad"))
    reporter.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [is_step_row(r) for r in rows] == [True, False, False]
    assert rows[1] == {"kind": "eval", "step": 1, "loss": 2.0, "ppl": pytest.approx(math.exp(2.0)), "name": "valid"}
    assert rows[2]["ppl"] == math.inf  # exp overflows: infinite, not an error
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[EVAL]")]
    assert lines == ["[EVAL] step=1 loss=2.0000 ppl=7.3891", "[EVAL] step=1 loss=800.0000 ppl=inf set=squad"]
    if importlib.util.find_spec("tensorboard") is not None:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(tmp_path / "tensorboard"))
        events.Reload()
        assert {"eval/loss", "eval/ppl", "eval/squad/loss", "train/loss"} <= set(events.Tags()["scalars"])
        assert [(e.step, e.value) for e in events.Scalars("eval/loss")] == [(1, 2.0)]


def test_sample_hash_is_in_the_row_only_when_taken(tmp_path):
    reporter = MetricsReporter(tmp_path, rank=0, world_size=1, device="cpu", peak_tflops=None, enable_tensorboard=False)
    reporter.report(StepReport(step=1, loss=3.0, step_time_s=0.1, samples=4))
    reporter.report(StepReport(step=2, loss=3.0, step_time_s=0.1, samples=4, sample_hash="0123abcd"))
    reporter.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert "sample_hash" not in rows[0] and rows[1]["sample_hash"] == "0123abcd"
