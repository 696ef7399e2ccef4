"""AMD Primus's example files resolve here to what AMD Primus resolves, key by key.

``amd_resolved.json`` (``tools/gen_amd_resolved.py``, from AMD Primus fd1eeab's own files and its merge
rules, with Megatron-LM d3528a2's defaults and derivations) holds AMD Primus's Megatron arguments for
each of its Megatron examples. Primus's resolved engine arguments must equal them, except the rows of
``ANNOUNCED`` (each said in a ``differs:`` line) and ``SAME_RUN`` (two spellings of one run).
Offline over the copies in tests/fixtures/amd_primus; over the whole checkout with AMD_PRIMUS_CHECKOUT.
"""
import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest

from tests.compat.amd_resolution import (AMD_MIRROR, CHECKOUT, FIXTURES, ROOT, TABLE, amd_table, primus_arguments,
                                         unexplained)


# Where Primus runs something else, and says so in a differs: line (docs/compat.md, "What differs").
ANNOUNCED = {
    # Megatron-LM refuses layers that do not divide over the stages (Llama 3.1 405B, Kimi-K2 on PP 8);
    # here a split is derived; or the MTP layer is placed on the last stage
    "pipeline_model_parallel_layout": "differs: pipeline_model_parallel_layout=",
}
# Two spellings of the same run: no line.
SAME_RUN = {
    # Megatron-LM reads `if args.mtp_num_layers:`: 0 and null both mean no MTP layer
    ("mtp_num_layers", 0, None),
}
SFT_UNREAD = {"mock_data"}  # an SFT module reads sft_dataset_name in both; the pretraining data flag is unread


def _compare(root: Path, key: str, row: list) -> list[str]:
    """The unexplained differences of one table row (empty when Primus resolves what AMD Primus does)."""
    path, module = key.rsplit(":", 1)
    keys = amd_table()["keys"]
    with contextlib.redirect_stdout(io.StringIO()):
        values, lines, stages = primus_arguments(root / path, keys)
    sft = stages[module] == "sft"
    return unexplained(f"{path}:{module}", keys, row, values[module], lines[module], ANNOUNCED,
                       lambda name, amd, ours: (name, amd, ours) in SAME_RUN or (name in SFT_UNREAD and sft))


def _rows(root: Path) -> list[tuple[str, list]]:
    return [(key, row) for key, row in amd_table()["rows"].items()
            if (root / key.rsplit(":", 1)[0]).is_file() and not _refused(key)]


def _refused(key: str) -> bool:
    """Families Primus refuses in one line (primus/compat/families.py): nothing to compare."""
    from primus.compat.families import model_reason

    import yaml
    path = key.rsplit(":", 1)[0]
    root = Path(CHECKOUT) if CHECKOUT else FIXTURES
    data = yaml.safe_load((root / path).read_text()) or {}
    module = (data.get("modules") or {}).get(key.rsplit(":", 1)[1]) or {}
    model = str(module.get("model", "")).replace("${PRIMUS_MODEL:", "").replace("}", "")
    return model_reason("megatron", model) is not None


FIXTURE_ROWS = _rows(FIXTURES)


def test_the_fixtures_cover_the_families_the_comparison_named():
    names = {key.split("/")[-1].split("-")[0] for key, _ in FIXTURE_ROWS}
    assert {"llama3.1_8B", "llama3.2_1B", "qwen3_32B", "qwen2.5_7B", "grok2", "gpt_oss_20B", "llama3.1_405B",
            "deepseek_v3", "kimi_k2", "mixtral_8x7B_v0.1", "llama3_8B"} <= names
    assert any("lora-sft" in key for key, _ in FIXTURE_ROWS)  # the modules:-less LoRA file, by extends:


@pytest.mark.parametrize("key, row", FIXTURE_ROWS, ids=[key.split("/", 3)[-1] for key, _ in FIXTURE_ROWS])
def test_primus_resolves_what_amd_primus_resolves(key, row):
    assert _compare(FIXTURES, key, row) == []


@pytest.mark.skipif(not CHECKOUT, reason="set AMD_PRIMUS_CHECKOUT to an AMD Primus fd1eeab checkout")
def test_every_amd_example_resolves_as_amd_primus_does():
    rows = _rows(Path(CHECKOUT))
    assert len(rows) > 200
    problems = [p for key, row in rows for p in _compare(Path(CHECKOUT), key, row)]
    assert problems == [], "\n".join(problems[:40])


@pytest.mark.e2e
@pytest.mark.skipif(not AMD_MIRROR.is_dir(), reason=f"AMD Primus mirror not available ({AMD_MIRROR})")
def test_the_table_is_a_fresh_generation():
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_amd_resolved.py"), "--git-dir",
                             str(AMD_MIRROR), "--framework", "megatron", "--check", "--out", str(TABLE)],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
