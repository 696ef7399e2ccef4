"""What Primus sets itself is on record: `primus.tiny_assets` paths are the winning source in
`config show --why`, and replacing a value the user wrote is said in one line."""
from __future__ import annotations

import os

import pytest

from primus.config.provenance import DERIVED
from primus.compat import AMD_PRIMUS
from primus.config.resolve import format_why, resolve_experiment
from primus.runtime.registry import backend_defaults, backend_derived
from tests.conftest import ROOT, TINY_EXAMPLE
from tests.helpers import run_cli

MEGATRON_TINY = ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml"


def _resolve(example, *overrides):
    return resolve_experiment(example, list(overrides), backend_defaults, backend_derived, dialect=AMD_PRIMUS)


def test_tiny_asset_paths_are_derived_and_win_visibly(monkeypatch, tmp_path):
    monkeypatch.setenv("PRIMUS_CACHE", str(tmp_path))
    resolved = _resolve(TINY_EXAMPLE, "hf_assets_path=/my/tokenizer")
    params = resolved.modules["pre_trainer"].params
    assert params["hf_assets_path"] == str(tmp_path / "tiny_llm" / "tokenizer")  # the saved config tells the truth
    chain = resolved.provenance.chain("modules.pre_trainer.hf_assets_path")
    assert [s.label for s in chain] == ["command line", DERIVED]  # the module preset names no tokenizer
    why = format_why(resolved, "hf_assets_path").splitlines()
    assert why[-2].strip().startswith("'/my/tokenizer'") and "command line" in why[-2]
    assert why[-1].startswith("  => ") and why[-1].endswith(f"from {DERIVED} (primus.tiny_assets)")
    assert resolved.provenance.overridden == [
        f"modules.pre_trainer.hf_assets_path='{tmp_path}/tiny_llm/tokenizer' from primus.tiny_assets replaces "
        "'/my/tokenizer' (command line 'hf_assets_path=/my/tokenizer'): primus.tiny_assets wins; "
        "set it to null to use your value"]
    assert format_why(resolved, "dataloader.dataset_path").splitlines()[-1].endswith(f"from {DERIVED} (primus.tiny_assets)")


def test_without_tiny_assets_the_users_value_stands(monkeypatch, tmp_path):
    monkeypatch.setenv("PRIMUS_CACHE", str(tmp_path))
    resolved = _resolve(TINY_EXAMPLE, "hf_assets_path=/my/tokenizer", "primus.tiny_assets=null")
    assert resolved.modules["pre_trainer"].params["hf_assets_path"] == "/my/tokenizer"
    assert resolved.provenance.chain("modules.pre_trainer.hf_assets_path")[-1].label == "command line"
    assert resolved.provenance.overridden == []
    plain = _resolve(ROOT / "examples" / "torchtitan" / "llama3.1_8B-pretrain.yaml")
    assert plain.provenance.chain("modules.pre_trainer.hf_assets_path")[-1].label == "experiment overrides"


def test_megatron_tiny_assets_are_derived_too(monkeypatch, tmp_path):
    monkeypatch.setenv("PRIMUS_CACHE", str(tmp_path))
    resolved = _resolve(MEGATRON_TINY)
    params = resolved.modules["pre_trainer"].params
    assert params["tokenizer_model"] == str(tmp_path / "tiny_llm" / "tokenizer") and params["mock_data"] is False
    for key in ("tokenizer_type", "tokenizer_model", "data_path", "mock_data"):
        assert resolved.provenance.chain(f"modules.pre_trainer.{key}")[-1].label == DERIVED, key


@pytest.mark.e2e
def test_train_says_when_a_derived_value_replaces_the_users(tmp_path):
    env = {"PRIMUS_CACHE": str(tmp_path / "cache"), "PRIMUS_WORKSPACE": str(tmp_path / "ws")}
    out = run_cli(["train", TINY_EXAMPLE, "hf_assets_path=/my/tokenizer", "--dry-run"], cwd=ROOT,
                  env={**os.environ, **env}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "[primus] derived modules.pre_trainer.hf_assets_path=" in out.stderr
    assert "replaces '/my/tokenizer' (command line 'hf_assets_path=/my/tokenizer'): primus.tiny_assets wins" in out.stderr
