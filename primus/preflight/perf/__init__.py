"""Performance tests: per-rank compute (GEMM, memory bandwidth) and collectives over size sweeps."""
from __future__ import annotations

COMPUTE_TESTS = ("gemm", "membw")
COLLECTIVE_TESTS = ("allreduce", "allgather", "reducescatter", "alltoall", "sendrecv")
NODE_TESTS = ("pairwise",)  # inter-node bandwidth node by node, bisecting slow pairs (pairwise.py)
ALL_TESTS = (*COMPUTE_TESTS, *COLLECTIVE_TESTS, *NODE_TESTS)
