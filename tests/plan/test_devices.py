"""Device peaks for MFU on every device, and the CPU's bf16 capability."""
import json

import pytest

from primus.plan import devices


@pytest.fixture
def peak_cache(tmp_path, monkeypatch):
    path = tmp_path / "cpu_peaks.json"
    monkeypatch.setenv("PRIMUS_PEAK_CACHE", str(path))
    monkeypatch.delenv("PRIMUS_PEAK_TFLOPS", raising=False)
    return path


def test_cpu_peak_is_measured_once_then_read_from_the_cache(peak_cache):
    import torch

    peak, source = devices.device_peak("cpu", "fp32")
    assert peak and peak > 0 and "just now" in source
    key = devices.cpu_peak_key("fp32", torch.get_num_threads())
    assert json.loads(peak_cache.read_text()) == {key: peak}
    again, source = devices.device_peak("cpu", "fp32")
    assert again == peak and "cached" in source


def test_no_probe_and_no_cache_is_no_peak(peak_cache):
    assert devices.device_peak("cpu", "fp32", probe=False)[0] is None


def test_the_cache_keeps_the_best_measurement(peak_cache):
    devices.record_cpu_peak("fp32", 2, 0.2)
    devices.record_cpu_peak("fp32", 2, 0.1)  # a loaded moment does not lower it
    assert devices.cpu_peak_tflops("fp32", 2, probe=False)[0] == 0.2
    assert devices.cpu_peak_tflops("fp32", 1, probe=False)[0] is None  # keyed by threads


def test_the_cpu_peak_is_its_fastest_native_dtype(peak_cache, monkeypatch):
    devices.record_cpu_peak("fp32", 2, 0.2)
    devices.record_cpu_peak("bf16", 2, 0.9)
    import torch

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(devices, "cpu_bf16_native", lambda: None)
    assert devices.device_peak("cpu", "bf16", probe=False)[0] == 0.2  # emulated bf16 is no peak
    monkeypatch.setattr(devices, "cpu_bf16_native", lambda: "amx_bf16")
    assert devices.device_peak("cpu", "bf16", probe=False)[0] == 0.9
    assert devices.device_peak("cpu", "fp32", probe=False)[0] == 0.2


def test_gpu_table_and_override_still_win(peak_cache):
    assert devices.device_peak("NVIDIA H100 80GB HBM3")[0] == 989.0
    assert devices.device_peak("cpu", override=1.5) == (1.5, "override")
    assert devices.device_peak("Some Unknown GPU")[0] is None


def test_bf16_detection_agrees_with_proc_cpuinfo():
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        pytest.skip("no /proc/cpuinfo flags here")
    expected = next((f for f in ("amx_bf16", "avx512_bf16") if f in flags), None)
    assert devices.cpu_bf16_native() == expected


@pytest.mark.parametrize("value, keep", [("force", True), ("off", False)])
def test_bf16_decision_can_be_forced(monkeypatch, value, keep):
    monkeypatch.setenv(devices.CPU_BF16_ENV, value)
    assert devices.cpu_bf16_decision()[0] is keep


def test_bf16_decision_follows_the_hardware(monkeypatch):
    monkeypatch.delenv(devices.CPU_BF16_ENV, raising=False)
    monkeypatch.setattr(devices, "cpu_bf16_native", lambda: None)
    keep, reason = devices.cpu_bf16_decision()
    assert not keep and "no native bf16" in reason
    monkeypatch.setattr(devices, "cpu_bf16_native", lambda: "avx512_bf16")
    assert devices.cpu_bf16_decision() == (True, "this CPU has AVX512-BF16")
