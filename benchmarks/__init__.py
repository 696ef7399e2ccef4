"""Primus benchmark suite (not part of the tests): ``python -m benchmarks.run [--quick] [--only ...]``."""
