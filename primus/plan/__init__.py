"""Planning without a cluster: the neutral model description (``ModelSpec``), how a job is split
over ranks (``ParallelLayout``), and the FLOPs, parameter and memory models built on them.

Used alike by the backends (FLOPs for MFU), ``primus plan``, preflight and the metrics; it imports
no engine and no launcher.
"""
