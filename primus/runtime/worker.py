"""Per-process entry point: ``python -m primus.runtime.worker TARGET PAYLOAD.json``.

The launcher starts this in every rank (through ``torch.distributed.run``) or calls
``run_target`` in-process for a single process. ``TARGET`` is ``package.module:function``
taking the payload dict and returning an exit status. ``@record`` makes torchelastic write a
failing rank's traceback to its error file, so the launcher can name the rank that broke.
"""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any


def run_target(target: str, payload: dict[str, Any]) -> int:
    module_name, _, function_name = target.partition(":")
    function = getattr(importlib.import_module(module_name), function_name)
    return int(function(payload) or 0)


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import record

    argv = sys.argv[1:] if argv is None else argv
    target, payload_path = argv[0], Path(argv[1])
    payload = json.loads(payload_path.read_text())
    return record(run_target)(target, payload)


if __name__ == "__main__":
    sys.exit(main())
