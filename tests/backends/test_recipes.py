"""Recipes, not branches: one table row per (engine, stage), and no stage test anywhere else."""
from __future__ import annotations

import re

import pytest

from primus.runtime.adapter import BackendAdapter, Recipe, WrappingRecipe
from primus.runtime.registry import adapter_classes, get_adapter, recipe_table
from tests.helpers import ROOT

EXPECTED = {("megatron", stage) for stage in ("pretrain", "sft", "lora")} | \
    {("torchtitan", stage) for stage in ("pretrain", "sft")} | \
    {("nemo_automodel", stage) for stage in ("pretrain", "finetune", "sft", "lora")}
# A comparison of a stage (or a recipe's mode) with a value, or a test on a stage name's text.
STAGE_TEST = re.compile(r"""(?<!for )\bstage\s*(==|!=|\bin\b|\bnot in\b)|(==|!=)\s*["'](sft|pretrain|finetune|lora)["']"""
                        r"""|\bis_post_training\([^)]*stage""")


def test_the_recipe_table_covers_every_engine_and_stage():
    assert set(recipe_table()) == EXPECTED


@pytest.mark.parametrize("row", sorted(EXPECTED), ids=lambda row: "-".join(row))
def test_each_row_is_a_recipe_of_its_stage(row):
    framework, stage = row
    adapter = get_adapter(framework)
    recipe_class = adapter._load(stage)
    assert issubclass(recipe_class, Recipe) and recipe_class.stage == stage
    assert issubclass(recipe_class, WrappingRecipe) == (stage == "lora")  # LoRA wraps the stage's own recipe


def test_every_member_of_the_contract_is_declared():
    """An adapter sets only what the contract declares, and nothing asks an adapter or a recipe for an
    undeclared member (no ``getattr`` probing)."""
    declared = set(vars(BackendAdapter)) | set(BackendAdapter.__annotations__)
    for cls in adapter_classes():
        own = {name for name in vars(cls) if not name.startswith("_")}
        assert own <= declared, (cls.__name__, own - declared)
    probes = [f"{path.relative_to(ROOT)}: {line.strip()}" for path in (ROOT / "primus").rglob("*.py")
              for line in path.read_text().splitlines() if re.search(r"getattr\((self\.)?adapter\b|getattr\(plan\.recipe\b", line)]
    assert not probes


def test_lora_is_chosen_by_the_section_and_wraps_the_stage():
    megatron, automodel = get_adapter("megatron"), get_adapter("nemo_automodel")
    assert megatron.recipe("sft", {"lora": {"enabled": True}}).base.stage == "sft"
    assert megatron.recipe("pretrain", {"lora": {"enabled": True}}).base.stage == "pretrain"
    assert megatron.recipe("sft", {"lora": {"enabled": False}}).stage == "sft"
    assert megatron.recipe("sft", {"lora": {"enabeld": True}}).stage == "lora"  # the LoRA recipe names the typo
    llm = {"recipe": "TrainFinetuneRecipeForNextTokenPrediction", "peft": {"dim": 8}}
    assert automodel.recipe("sft", llm).stage == "lora"
    assert automodel.recipe("pretrain", {"recipe": "TrainDiffusionRecipe", "peft": {"dim": 8}}).stage == "pretrain"


def test_no_stage_test_outside_the_dispatch():
    """A recipe IS its stage: no code in the backends (nor what they hand off to) asks which stage it runs;
    the only place a stage is looked at is the dispatch (``BackendAdapter.recipe`` / ``canonical_stage``)."""
    found = []
    for folder in ("backends", "hf", "data"):
        for path in (ROOT / "primus" / folder).rglob("*.py"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if STAGE_TEST.search(code) and "pipeline" not in code:
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found
