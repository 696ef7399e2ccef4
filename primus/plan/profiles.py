"""Device profiles for step-time projection: what a device can do, from public specs, and how much of it
training kernels reach (one efficiency model per vendor), plus a ``local`` profile measured by ``primus preflight``.

A profile holds peaks (dense FLOP/s by dtype, HBM bandwidth, link bandwidth and latency) and an
``Efficiency``: the fraction of each peak that real kernels reach. The peaks are data-sheet numbers,
each cited in ``SOURCES``; the efficiencies are per vendor, each justified below by a public
microbenchmark. Nothing is fitted per experiment: the published-throughput corpus
(``benchmarks/published/``) checks the whole model against measurements it never saw per row.

The ``local`` profile is this host measured (``primus preflight`` runs the GEMM, memory-bandwidth,
attention and collective probes and writes it to a cache file per host, ``local_profile_path()``),
so the projection can be checked against real runs on any machine, CPU included.
"""
from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from primus.config.errors import ConfigError, did_you_mean


@dataclass(frozen=True)
class Efficiency:
    """Fraction of each peak that training kernels reach on this device (1.0 = the peak itself).

    ``gemm``/``gemm_fp8``: large dense GEMMs (bf16/fp16, fp8); smaller GEMMs are slower by the
    roofline (a GEMM that moves more bytes than it computes is memory-bound). ``attention``: fused
    attention forward and backward (the engine's fused kernel: cuDNN/TE, aiter), of the bf16 peak;
    ``attention_sdpa``: PyTorch's SDPA flash kernel (flash attention 2), as TorchTitan runs it. ``hbm``: elementwise kernels (norms,
    activations, optimizer). ``intra_link``/``inter_link``: collectives' bus bandwidth over the
    nominal link. ``kernel_overhead_s``: launch and framework cost per kernel not hidden by async launch."""

    gemm: float
    gemm_fp8: float
    attention: float
    attention_sdpa: float
    hbm: float
    intra_link: float
    inter_link: float
    kernel_overhead_s: float = 0.0
    # Measured profiles: projected over measured compute of a reference training step on the device
    # (primus.preflight.perf.reference_step); the layers' and head's compute is divided by it.
    compute: float = 1.0


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    peak_tflops: dict[str, float]  # dense, no sparsity: bf16 (= fp16), fp8, fp32
    hbm_gbps: float  # device-memory bandwidth, GB/s (1e9)
    memory_gib: float
    intra_node_gbps: float  # per-device unidirectional bandwidth to its node peers (NVLink / Infinity Fabric)
    inter_node_gbps: float  # per-device network bandwidth (one NIC per device)
    intra_latency_s: float
    inter_latency_s: float
    efficiency: Efficiency
    gpus_per_node: int = 8
    sources: dict[str, str] = field(default_factory=dict)
    # Measured profiles only: GEMM peak (TFLOP/s) by intra-op thread count (CPU ranks share the cores).
    gemm_tflops_by_threads: dict[int, float] = field(default_factory=dict)
    cores: int | None = None
    # A GPU's collectives run on their own engines beside the kernels; a CPU's gloo collectives copy on
    # the cores the ranks compute on, so there what the engine overlaps is exposed all the same.
    overlaps_comm: bool = True
    # Measured profiles only. An MoE's expert GEMM as ``torch._grouped_mm`` runs it, forward + backward,
    # TFLOP/s by dtype at the profile's thread count (absent: the plain GEMM peak).
    grouped_gemm_tflops: dict[str, float] = field(default_factory=dict)
    # gloo has no reduce-scatter of its own: torch runs ``reduce_scatter_tensor`` as an all-reduce.
    reduce_scatter_as_allreduce: bool = False
    # One AdamW step, eager and unfused as on a CPU, in seconds per parameter (0: the bytes model): torch's
    # for-loop implementation, and its foreach one (0: as the for-loop).
    optimizer_s_per_param: float = 0.0
    optimizer_foreach_s_per_param: float = 0.0
    # Measured profiles only: the compute efficiency by intra-op thread count (a rank gets its threads' entry).
    compute_efficiency_by_threads: dict[int, float] = field(default_factory=dict)

    def peak(self, dtype: str) -> float:
        """Dense peak in FLOP/s for ``dtype`` (fp8 falls back to bf16 where the device has no fp8 units)."""
        key = {"fp16": "bf16"}.get(dtype, dtype)
        tflops = self.peak_tflops.get(key) or self.peak_tflops.get("bf16") or self.peak_tflops["fp32"]
        return tflops * 1e12

    def grouped_peak(self, dtype: str) -> float:
        """FLOP/s of an MoE's grouped expert GEMM in ``dtype`` (the plain peak where none was measured)."""
        key = {"fp16": "bf16"}.get(dtype, dtype)
        tflops = self.grouped_gemm_tflops.get(key)
        return tflops * 1e12 if tflops else self.peak(dtype)

    def for_ranks_per_node(self, ranks: int, threads: int | None = None) -> "DeviceProfile":
        """A measured CPU profile as one of ``ranks`` processes sharing the host's cores (each gets
        cores // ranks threads, as torchrun's OMP_NUM_THREADS=1 and Primus' default give, or ``threads``)."""
        if not self.gemm_tflops_by_threads:
            return self
        threads = threads or max(1, (self.cores or 1) // max(1, ranks))
        known = sorted(self.gemm_tflops_by_threads)
        best = max((t for t in known if t <= threads), default=known[0])
        tflops = self.gemm_tflops_by_threads[best] * threads / best
        if ranks > 1:  # ranks that share the cores together do at most what all the cores do at once
            tflops = min(tflops, self.gemm_tflops_by_threads[known[-1]] / known[-1] * threads)
        hbm_share = max(1, ranks)  # ranks share the memory bus
        hbm = self.hbm_gbps / hbm_share
        fp32 = self.peak_tflops.get("fp32") or tflops
        # each dtype, and the grouped GEMM, keeps its measured rate relative to fp32 (bf16: emulated, or on bf16 units)
        efficiency = self.efficiency
        if self.compute_efficiency_by_threads:
            nearest = max((t for t in sorted(self.compute_efficiency_by_threads) if t <= threads),
                          default=min(self.compute_efficiency_by_threads))
            efficiency = replace(efficiency, compute=self.compute_efficiency_by_threads[nearest])
        return replace(self, efficiency=efficiency,
                       peak_tflops={k: tflops * v / fp32 for k, v in self.peak_tflops.items()},
                       grouped_gemm_tflops={k: tflops * v / fp32 for k, v in self.grouped_gemm_tflops.items()},
                       hbm_gbps=hbm, optimizer_s_per_param=self.optimizer_s_per_param * hbm_share,
                       optimizer_foreach_s_per_param=self.optimizer_foreach_s_per_param * hbm_share)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DeviceProfile":
        data = dict(data)
        data["efficiency"] = Efficiency(**data["efficiency"])
        data["gemm_tflops_by_threads"] = {int(k): v for k, v in (data.get("gemm_tflops_by_threads") or {}).items()}
        data["compute_efficiency_by_threads"] = {int(k): v for k, v in
                                                 (data.get("compute_efficiency_by_threads") or {}).items()}
        return cls(**data)


# --- one efficiency model per vendor --------------------------------------------------------------
# NVIDIA (Hopper, Blackwell). Azure's AI-benchmarking-guide (github.com/Azure/AI-benchmarking-guide,
# Azure_Results/ND_H100_v5_results.md, ND_H200_v5_results.md, ND_GB200_v6_results.md) measured:
# cuBLASLt FP8 GEMM 8192^3 at 1290 (H100), 1301 (H200), 2848 (GB200) TFLOP/s = 0.65 / 0.66 / 0.57 of
# the FP8 peak; STREAM copy 2.90 of 3.35 TB/s (H100), 4.01 of 4.8 (H200) = 0.87 / 0.84; NCCL
# all-reduce bus bandwidth 479 GB/s on 8 H100s (NVLS) against 450 GB/s NVLink per direction; flash
# attention 2 (head dim 128, s 8192) 328 TFLOP/s = 0.33 of the bf16 peak. bf16 GEMMs reach a larger
# share of their (half as high) peak than fp8: 0.75 is the usual figure for cuBLAS at these sizes.
# Megatron/NeMo use cuDNN fused attention, faster than FA2: 0.40 sits between FA2 and FA3's 0.6;
# PyTorch's SDPA runs FA2 (forward 0.33, its backward slower): 0.30.
# The same tables' size sweeps fix the per-GEMM fixed cost: the H100's FP8 GEMM reaches 0.21, 0.32, 0.78 and
# 0.94 of its large-GEMM rate at 1024^3, 1024x2145x1024, 2048^3 and 4096^3 -- a constant ~6 us on top of
# FLOPs / rate (GB200: ~4 us). The same cost is charged to every other kernel (launch, tail).
NVIDIA = Efficiency(gemm=0.75, gemm_fp8=0.62, attention=0.40, attention_sdpa=0.30, hbm=0.85, intra_link=0.80, inter_link=0.80,
                    kernel_overhead_s=6e-6)
# AMD (CDNA3, CDNA4). Same guide, ND_MI300X_v5_results.md: hipBLASLt FP8 GEMM 8192^3 1159 TFLOP/s =
# 0.44 of 2615; STREAM copy 4.11 of 5.3 TB/s = 0.78; RCCL all-reduce bus bandwidth 317 GB/s against
# 448 GB/s of Infinity Fabric (7 x 64 GB/s) = 0.71; flash attention 2 (head dim 64) 329 TFLOP/s =
# 0.25 of the bf16 peak: PyTorch SDPA's; AMD's fused kernels (aiter/CK, head dim 128 as in Llama) 0.30. bf16 GEMMs: 0.55 of peak, the
# same gap to fp8 as on NVIDIA.
# Its size sweep (0.05, 0.10, 0.37, 0.82 of the large-GEMM rate at the sizes above) is a ~25 us constant
# per GEMM on MI300X, four times NVIDIA's; charged to every kernel.
AMD = Efficiency(gemm=0.55, gemm_fp8=0.44, attention=0.30, attention_sdpa=0.25, hbm=0.78, intra_link=0.71, inter_link=0.80,
                 kernel_overhead_s=25e-6)

_NV_LAT, _AMD_LAT, _NET_LAT = 3e-6, 5e-6, 10e-6  # per-hop latencies (NCCL/RCCL tests' small-message floor)

PROFILES: dict[str, DeviceProfile] = {
    "h100": DeviceProfile("h100", {"bf16": 989.4, "fp8": 1978.9, "fp32": 67.0}, 3350, 80, 450, 50, _NV_LAT, _NET_LAT, NVIDIA),
    "h200": DeviceProfile("h200", {"bf16": 989.4, "fp8": 1978.9, "fp32": 67.0}, 4800, 141, 450, 50, _NV_LAT, _NET_LAT, NVIDIA),
    "b200": DeviceProfile("b200", {"bf16": 2250.0, "fp8": 4500.0, "fp32": 80.0}, 8000, 180, 900, 50, _NV_LAT, _NET_LAT, NVIDIA),
    # TorchTitan's benchmark H100s (Grand Teton): 96 GB HBM2e at 2.4 TB/s, power-limited to 500 W
    "h100-hbm2e": DeviceProfile("h100-hbm2e", {"bf16": 835.5, "fp8": 1671.0, "fp32": 60.0}, 2400, 96, 450, 50, _NV_LAT, _NET_LAT, NVIDIA),
    "mi300x": DeviceProfile("mi300x", {"bf16": 1307.4, "fp8": 2614.9, "fp32": 163.4}, 5300, 192, 448, 50, _AMD_LAT, _NET_LAT, AMD),
    "mi325x": DeviceProfile("mi325x", {"bf16": 1307.4, "fp8": 2614.9, "fp32": 163.4}, 6000, 256, 448, 50, _AMD_LAT, _NET_LAT, AMD),
    "mi355x": DeviceProfile("mi355x", {"bf16": 2516.6, "fp8": 5033.2, "fp32": 157.3}, 8000, 288, 537.6, 50, _AMD_LAT, _NET_LAT, AMD),
}

# Where each number comes from (data sheets; the network is one 400 Gb/s NIC per device, as in the
# DGX/HGX H100/H200/B200 and AMD's MI300X/MI325X/MI355X reference nodes).
SOURCES: dict[str, str] = {
    "h100": "NVIDIA H100 Tensor Core GPU datasheet (SXM5): BF16 989.4 / FP8 1,978.9 TFLOP/s dense (half the "
            "sparsity figures), HBM3 3.35 TB/s, 80 GB, NVLink 900 GB/s (450 per direction); ConnectX-7 400 Gb/s",
    "h200": "NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16 989.4 / FP8 1,978.9 TFLOP/s dense, HBM3e 4.8 TB/s, "
            "141 GB, NVLink 900 GB/s (450 per direction); ConnectX-7 400 Gb/s",
    "b200": "NVIDIA DGX B200 datasheet: 72 PFLOPS FP8 training per 8 GPUs with sparsity, i.e. BF16 2,250 / FP8 "
            "4,500 TFLOP/s dense per GPU, HBM3e 8 TB/s, 1,440 GB / 8 = 180 GB, NVLink 5 1.8 TB/s (900 per "
            "direction); 8 x ConnectX-7 400 Gb/s",
    "h100-hbm2e": "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md: H100 96 GB HBM2e, 2.4 TB/s, "
                  "500 W limit, 'peak between SXM and NVL'; the H100 NVL data sheet's BF16 835.5 / FP8 1,671 "
                  "TFLOP/s dense (the bound they name) as its peak; NVLink 4 (450 per direction) and 400 Gb/s RDMA per GPU as stated",
    "mi300x": "AMD Instinct MI300X data sheet: FP16/BF16 1,307.4 / FP8 2,614.9 TFLOP/s dense, HBM3 5.3 TB/s, "
              "192 GB, 7 Infinity Fabric links x 64 GB/s per direction (448 per direction); 400 Gb/s NIC per GPU",
    "mi325x": "AMD Instinct MI325X data sheet: FP16/BF16 1,307.4 / FP8 2,614.9 TFLOP/s dense, HBM3E 6 TB/s, "
              "256 GB, 7 Infinity Fabric links x 64 GB/s per direction (448 per direction) as MI300X; 400 Gb/s NIC per GPU",
    "mi355x": "AMD Instinct MI355X data sheet: FP16/BF16 2,516.6 / FP8 5,033.2 TFLOP/s dense, HBM3E 8 TB/s, "
              "288 GB, Infinity Fabric 1,075 GB/s aggregate (537.6 per direction); 400 Gb/s NIC per GPU",
    "efficiency": "NVIDIA / AMD efficiency constants: see the comments above NVIDIA and AMD in primus/plan/profiles.py",
}

LOCAL = "local"


def profile_names() -> list[str]:
    return sorted(PROFILES) + [LOCAL]


# --- the measured profile of this host ------------------------------------------------------------

def local_profile_path(host: str | None = None) -> Path:
    """One file per host: ``$PRIMUS_PROFILE_CACHE`` or ``~/.cache/primus/profiles/<host>.json``."""
    root = os.environ.get("PRIMUS_PROFILE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "primus", "profiles")
    return Path(root) / f"{host or socket.gethostname()}.json"


def write_local_profile(profile: DeviceProfile, path: Path | None = None) -> Path:
    path = path or local_profile_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(profile.to_dict(), indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def read_local_profile(path: Path | None = None) -> DeviceProfile | None:
    path = path or local_profile_path()
    try:
        return DeviceProfile.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def get_profile(name: str) -> DeviceProfile:
    """A named profile (``mi355x``, ``h100`` ...) or ``local`` (measured by ``primus preflight``)."""
    key = name.lower()
    if key == LOCAL:
        profile = read_local_profile()
        if profile is None:
            raise ConfigError(f"--device local: no measured profile at {local_profile_path()}; run "
                              "`primus preflight --tests gemm,membw,attention` on this host first")
        return profile
    if key not in PROFILES:
        raise ConfigError(f"unknown device '{name}'{did_you_mean(key, profile_names())}; known: "
                          f"{', '.join(profile_names())}")
    return replace(PROFILES[key], sources={"peaks": SOURCES[key], "efficiency": SOURCES["efficiency"]})
