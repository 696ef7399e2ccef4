"""TorchTitan supervised fine-tuning: Primus's instruction data as TorchTitan's dataloader
(``primus.backends.torchtitan.sft_data.SFTDataLoader``, its keys that ``Config``'s fields), the
validator on the held-out split, usually from a Hugging Face checkpoint (``hf_start``)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from primus.backends.torchtitan import hf_start
from primus.backends.torchtitan.recipes.common import TorchTitanPlan, TorchTitanRecipe, build_tiny_sft_assets
from primus.config.errors import ConfigError
from primus.config.provenance import Provenance, error_at
from primus.data.tiny_assets import built_by_prepare, tiny_assets_dir
from primus.runtime.adapter import ModuleConfig



class TorchTitanSFT(TorchTitanRecipe):
    stage = "sft"
    data_keys = ("dataset_path", "valid_dataset_path")

    def dataloader_config(self) -> Any:
        from primus.backends.torchtitan.sft_data import SFTDataLoader

        return SFTDataLoader.Config()

    def params(self, module: ModuleConfig, derived: list) -> dict[str, Any]:
        """A run on instructions names its files itself (``primus.tiny_assets`` only builds them); the model
        comes from the checkpoint's config.json."""
        return hf_start.with_hf_start(module.params, derived, prefix=module.prefix,
                                      tiny_root=tiny_assets_dir(module.params))

    def finish_config(self, cfg: Any, attn_backend: str, fail: Callable[[str, str], ConfigError]) -> list:
        """The validator reads the held-out split. Packed conversations must not attend to each other:
        flex and varlen keep them apart themselves; causal SDPA (the CPU backend) is given each
        sequence's per-document mask instead (``attention.DocumentCausalSDPA``)."""
        loader = cfg.dataloader
        if not loader.dataset_path:
            raise fail("dataloader.dataset_path", "stage sft needs instruction data (a JSONL file or a folder of them)")
        derived = []
        if loader.packing and attn_backend == "sdpa":
            from primus.backends.torchtitan.attention import use_document_sdpa

            if cfg.parallelism.context_parallel_degree > 1:  # TorchTitan's CP takes no document boundaries here
                raise fail("dataloader.packing", "packed conversations on SDPA need each whole sequence on one rank; "
                                                 "context parallelism splits it. Use packing: false, or "
                                                 "parallelism.context_parallel_degree: 1")
            if not use_document_sdpa(cfg.model_spec.model):  # e.g. flex kept for attention sinks, HF attention
                raise fail("dataloader.packing", "packed conversations need document-aware attention, and this "
                                                 "model's attention takes no per-document mask on this host; use "
                                                 "packing: false (one conversation per sequence, padded)")
            derived.append(("attn_backend", "sdpa, per-document causal mask",
                            "dataloader.packing: packed conversations attend only within themselves"))
        if cfg.validator.enable and not loader.valid_dataset_path and loader.valid_fraction <= 0:
            raise fail("validator.enable", "validation needs held-out instructions: dataloader.valid_fraction > 0 or "
                                           "dataloader.valid_dataset_path")
        if cfg.validator.enable:
            cfg.validator.dataloader = replace(loader, split="valid", infinite=cfg.validator.steps != -1)
            derived.append(("validator.dataloader", "the held-out instruction split", "stage sft"))
        return derived

    def check_inputs(self, plan: TorchTitanPlan, provenance: Provenance | None = None) -> None:
        """The instruction files exist (the common check) and hold training records: a folder without
        them is said with what it holds."""
        super().check_inputs(plan, provenance)
        from primus.data.sft import jsonl_files, record_files

        loader = plan.engine_config.dataloader
        for key, read in (("dataset_path", jsonl_files), ("valid_dataset_path", record_files)):
            path = getattr(loader, key, None)
            if not path or built_by_prepare(Path(path).expanduser(), plan.module.params):
                continue
            try:
                read(path)
            except ConfigError as exc:
                raise error_at(provenance, f"{plan.module.prefix}.dataloader.{key}", str(exc)) from None

    def build_tiny_assets(self, plan: TorchTitanPlan, root: Path, log: Callable[[str], None]) -> None:
        build_tiny_sft_assets(root, log)
