"""Performance tests: per-rank compute (GEMM, memory bandwidth) and collectives over size sweeps."""
from __future__ import annotations

COMPUTE_TESTS = ("gemm", "membw")
COLLECTIVE_TESTS = ("allreduce", "allgather", "reducescatter", "alltoall", "sendrecv")
ALL_TESTS = (*COMPUTE_TESTS, *COLLECTIVE_TESTS)
