"""Accelerator peaks and memory sizes, for MFU and for "does it fit" (vendor data sheets)."""
from __future__ import annotations

import os

# Dense peak TFLOP/s per device (no sparsity), by dtype. Sources: vendor data sheets.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "h100": {"bf16": 989.0, "fp32": 67.0},
    "h200": {"bf16": 989.0, "fp32": 67.0},
    "b200": {"bf16": 2250.0, "fp32": 80.0},
    "a100": {"bf16": 312.0, "fp32": 19.5},
    "mi300x": {"bf16": 1307.4, "fp32": 163.4},
    "mi325x": {"bf16": 1307.4, "fp32": 163.4},
    "mi355x": {"bf16": 2516.6, "fp32": 157.3},
}


# Device memory per accelerator, GiB as the runtime reports it (vendor data sheets).
DEVICE_MEMORY_GIB: dict[str, float] = {
    "a100": 80.0,
    "h100": 80.0,
    "h200": 141.0,
    "b200": 180.0,
    "mi300x": 192.0,
    "mi325x": 256.0,
    "mi355x": 288.0,
}


def device_key(device_name: str) -> str | None:
    """Map a device name (``NVIDIA H100 80GB HBM3``, ``AMD Instinct MI300X``) to a peak key."""
    lowered = device_name.lower().replace(" ", "")
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if key in lowered:
            return key
    return None


def peak_tflops(device_name: str, dtype: str = "bf16", override: float | None = None) -> float | None:
    """Peak TFLOP/s for MFU; ``None`` where unknown (CPU) so MFU reads n/a, not invented."""
    if override is None and os.environ.get("PRIMUS_PEAK_TFLOPS"):
        override = float(os.environ["PRIMUS_PEAK_TFLOPS"])
    if override:
        return float(override)
    key = device_key(device_name)
    if key is None:
        return None
    return PEAK_TFLOPS[key].get(dtype)
