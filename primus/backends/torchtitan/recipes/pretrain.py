"""TorchTitan pretraining: its text dataloader on a dataset of its registry, or on local files
(``dataloader.dataset: jsonl|text`` with ``dataset_path``, registered when the run starts)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primus.backends.torchtitan import hf_start
from primus.backends.torchtitan.recipes.common import TorchTitanPlan, TorchTitanRecipe, build_tiny_sft_assets
from primus.config.errors import did_you_mean
from primus.config.provenance import error_at
from primus.data.tiny_assets import tiny_assets_dir
from primus.runtime.adapter import ModuleConfig

if TYPE_CHECKING:
    from primus.config.provenance import Provenance
    from primus.runtime.context import RunContext

LOCAL_DATASETS = ("jsonl", "text", "mock")  # added to TorchTitan's DATASETS table when a run starts


def with_tiny_assets(params: dict[str, Any], derived: list[tuple[str, Any, str]] | None = None) -> dict[str, Any]:
    """Point the tokenizer and dataset at the locally built tiny assets, when asked to."""
    root = tiny_assets_dir(params)
    if root is None:
        return params
    params = {**params, "dataloader": {**(params.get("dataloader") or {})}}
    params["hf_assets_path"] = str(root / "tokenizer")
    params["dataloader"]["dataset_path"] = str(root / "corpus")
    params["dataloader"]["dataset"] = "jsonl"
    if derived is not None:
        derived.append(("hf_assets_path", params["hf_assets_path"], "primus.tiny_assets"))
        derived.append(("dataloader.dataset_path", params["dataloader"]["dataset_path"], "primus.tiny_assets"))
        derived.append(("dataloader.dataset", "jsonl", "primus.tiny_assets"))
    return params


def register_local_datasets() -> None:
    """TorchTitan's extension point for datasets is its ``DATASETS`` table: add local files (at run time)."""
    from datasets import load_dataset
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets.text_datasets import DATASETS

    def files(path: str, pattern: str) -> list[str]:
        p = Path(path)
        return sorted(str(f) for f in p.glob(pattern)) if p.is_dir() else [str(p)]

    DATASETS.setdefault("jsonl", DatasetConfig(
        path="", sample_processor=lambda sample: sample["text"],
        loader=lambda path: load_dataset("json", data_files=files(path, "*.jsonl"), split="train")))
    DATASETS.setdefault("text", DatasetConfig(
        path="", sample_processor=lambda sample: sample["text"],
        loader=lambda path: load_dataset("text", data_files=files(path, "*.txt"), split="train")))
    from primus.backends.torchtitan import mock_data

    mock_data.register(DATASETS)  # AMD Primus's training.mock_data


class TorchTitanPretrain(TorchTitanRecipe):
    stage = "pretrain"

    def describe(self, module: ModuleConfig, world_size: int | None, provenance: "Provenance | None" = None, *,
                 device: str = "cpu") -> TorchTitanPlan | None:
        """From TorchTitan's registry as tools/gen_torchtitan_plan_table.py recorded it, without importing
        torch or TorchTitan; None where the table cannot tell (a HF start, Llama 4, a registry keyword it
        does not cover): the engine's own plan then."""
        from pathlib import Path

        from primus.backends.torchtitan.config import BuildContext
        from primus.backends.torchtitan.plan import describe
        from primus.backends.torchtitan.recipes.common import _check_world_size
        from primus.plan.sizing import LLM
        from primus.runtime.adapter import CheckpointSpec, EnginePlan

        if hf_start.hf_source(module.params) is not None:
            return None
        if world_size is not None:
            _check_world_size(module, world_size, provenance)
        found = describe(module.params, world_size, device, BuildContext(provenance, module.prefix).fail)
        if found is None:
            return None
        model, layout = found
        return EnginePlan(module, self, world_size, None, CheckpointSpec(Path(".")), model, layout, sizing=LLM)

    def dataloader_config(self) -> Any:
        from primus.backends.torchtitan.data import PrimusTextDataLoader

        return PrimusTextDataLoader.Config()

    def derived_params(self, params: dict[str, Any]) -> list[tuple[str, Any, str]]:
        """What ``primus.tiny_assets`` sets; resolution records it, so ``config show --why`` tells.
        A run from a HF checkpoint names its own files: tiny assets only build them."""
        derived: list[tuple[str, Any, str]] = []
        if hf_start.hf_source(params) is None:
            with_tiny_assets(params, derived)
        return derived

    def params(self, module: ModuleConfig, derived: list) -> dict[str, Any]:
        """The tiny corpus and tokenizer, or (a run from a HF checkpoint) the model its config.json describes."""
        if hf_start.hf_source(module.params) is None:
            return with_tiny_assets(module.params, derived)
        return hf_start.with_hf_start(module.params, derived, prefix=module.prefix,
                                      tiny_root=tiny_assets_dir(module.params))

    def check_config(self, cfg: Any, module: ModuleConfig, provenance: "Provenance | None") -> None:
        """The dataset is one of TorchTitan's registry or a local one (registered when the run starts)."""
        from torchtitan.hf_datasets.text_datasets import DATASETS

        dataset = getattr(cfg.dataloader, "dataset", None)
        known = [*DATASETS, *(name for name in LOCAL_DATASETS if name not in DATASETS)]
        if dataset is not None and dataset.lower() not in known:
            raise error_at(provenance, f"{module.prefix}.dataloader.dataset", f"unknown dataset '{dataset}'"
                           f"{did_you_mean(dataset, known)}; known: {', '.join(known)}")

    def build_tiny_assets(self, plan: TorchTitanPlan, root: Path, log: Callable[[str], None]) -> None:
        if hf_start.hf_source(plan.module.params) is not None:  # the tiny HF model the run starts from
            build_tiny_sft_assets(root, log)
        elif not (root / "corpus" / "data.jsonl").exists():
            from primus.data.tiny_assets import ensure_tiny_assets

            log(f"building the tiny tokenizer and learnable corpus in {root} (primus.tiny_assets)")
            ensure_tiny_assets(root)

    def before_build(self, plan: TorchTitanPlan, ctx: "RunContext") -> None:
        register_local_datasets()
