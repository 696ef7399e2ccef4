"""TorchTitan behind the adapter contract: its own ``Trainer`` from its own ``Trainer.Config``.
Its recipes: ``recipes/`` (the table below)."""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from primus.runtime.adapter import BackendAdapter


class TorchTitanAdapter(BackendAdapter):
    name = "torchtitan"
    distribution = "torchtitan"
    import_probe = "torchtitan.trainer"
    extra = "torchtitan"
    patches = "primus.backends.torchtitan.patches"
    recipes = {
        "pretrain": "primus.backends.torchtitan.recipes.pretrain:TorchTitanPretrain",
        "sft": "primus.backends.torchtitan.recipes.sft:TorchTitanSFT",
    }

    def import_module(self, name: str) -> Any:
        """torchtitan 0.3.0 imports triton unconditionally; on a host without it (CPU) the import runs
        with a stand-in that is gone afterwards (``patches.triton_import_stub``). Its import-time
        ``torch.compile`` calls wait for their first call (``patches.compile_on_first_call``)."""
        from primus.backends.torchtitan.patches import compile_on_first_call

        compile_on_first_call()
        if importlib.util.find_spec("triton") is None:
            from primus.backends.torchtitan.patches import triton_import_stub

            triton_import_stub()
        return importlib.import_module(name)
