"""``primus preflight``: is this cluster ready for this job? And ``primus plan``: will it fit?

Layout: ``checks/`` gather facts on every rank and judge them on rank 0; ``perf/`` measures
GEMM, memory bandwidth and collectives; ``rendezvous`` names ranks that never join;
``report/`` turns the JSON (the source of truth) into Markdown and PDF; ``estimate`` and
``layout`` are the pure functions behind ``primus plan``; ``worker.worker_main`` runs on
each rank; ``cli`` registers both subcommands.

Exit status: 0 no ``fail`` finding (warnings allowed); 1 at least one ``fail`` finding,
including ranks that did not join and, for ``plan``, a layout that is wrong or does not
fit the device; 2 a user error (bad option or thresholds file, unknown device).
Thresholds: ``thresholds.yaml`` here, overridable with ``--thresholds FILE``.
"""
