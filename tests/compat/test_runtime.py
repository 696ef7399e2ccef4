"""What the compatibility layer does when a run starts: lines, averages, mock-data tokenizers (its refusals:
tests/runtime/test_admission.py)."""
from primus.compat.rules import Translation
from primus.compat.runtime import announce, localize_hub_references
from primus.runtime.averages import StepAverages
from primus.runtime.metrics import StepMetrics


def test_each_translation_is_said_and_a_kernel_switch_names_the_kernel_that_runs():
    lines, derived = [], []
    announce([Translation("enable_primus_turbo", True, None, "Primus-Turbo kernel switch", "kernel"),
              Translation("stderr_sink_level", "DEBUG", "logging.level", "console level", "rename", "", "DEBUG")],
             lines.append, lambda *args: derived.append(args))
    assert lines == ["translated enable_primus_turbo=true → stock kernel here (Primus-Turbo kernel switch)",
                     "translated stderr_sink_level=DEBUG → logging.level=DEBUG (console level)"]
    assert derived == [("enable_primus_turbo", "stock kernel", "Primus-Turbo not installed")]


def test_mock_data_needs_no_hub_tokenizer_when_the_model_knows_its_vocabulary():
    derived = []
    params = {"tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": "meta-llama/Llama-3.1-8B",
              "mock_data": True, "vocab_size": 128256}
    out = localize_hub_references("megatron", params, local_rank=0, log_derived=lambda *a: derived.append(a))
    assert out["tokenizer_type"] == "NullTokenizer" and out["tokenizer_model"] == "meta-llama/Llama-3.1-8B"
    assert derived[0][0] == "tokenizer_type" and "not fetched" in derived[0][2]
    assert params["tokenizer_type"] == "HuggingFaceTokenizer"  # the caller's dict is untouched


def test_a_local_tokenizer_directory_is_left_alone(tmp_path):
    params = {"tokenizer_model": str(tmp_path), "tokenizer_type": "HuggingFaceTokenizer"}
    assert localize_hub_references("megatron", params, local_rank=0, log_derived=None) is params


def step(n, time_s):
    return StepMetrics(step=n, loss=1.0, step_time=time_s, samples_per_sec=1, samples_per_sec_per_gpu=1,
                       tokens_per_sec=100 / time_s, tflops=10 / time_s, mfu=None, mem_gb=0)


def test_step_averages_skip_the_first_steps_and_restart_every_window():
    averages = StepAverages(skip=2, window=3)
    got = [averages.update(step(n, t)).get("avg_step_time") for n, t in
           enumerate([9.0, 9.0, 1.0, 2.0, 3.0, 5.0, 7.0], start=1)]
    assert got[:2] == [None, None]  # steps 1-2 left out (AMD: log_avg_skip_iterations)
    assert got[2:5] == [1.0, 1.5, 2.0]
    assert got[5:] == [5.0, 6.0]  # a new window after 3 steps (AMD: log_avg_reset_interval)
