"""AMD Primus's TorchTitan example files train here what they train in AMD Primus, key by key.

``amd_resolved_torchtitan.json`` (``tools/gen_amd_resolved.py``, from AMD Primus fd1eeab's own files and its
merge rules) holds, for each of its TorchTitan examples, the settings its trainer reads: the model, the
optimiser and its schedule, batch, length, compile, activation checkpointing, the data trained on (``mock``
where AMD Primus's ``mock_data`` is on), the layout. Primus's TorchTitan 0.3.0 ``Trainer.Config`` for the same
file, planned for the device in its folder, must say the same, except the columns of ``ANNOUNCED`` (each said
in a ``differs:`` line). Offline over the copies in tests/fixtures/amd_primus; over the whole checkout with
AMD_PRIMUS_CHECKOUT. Planning only: no training.
"""
import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest

from tests.compat.amd_resolution import (AMD_MIRROR, CHECKOUT, FIXTURES, ROOT, TORCHTITAN_TABLE, amd_table,
                                         primus_arguments, unexplained)

pytest.importorskip("torchtitan")  # the plan is TorchTitan 0.3.0's own Trainer.Config


# Where Primus runs something else, and says so in a differs: line (docs/compat.md, "Key by key against AMD
# Primus's own resolution").
ANNOUNCED = {
    # AMD's default selective_ac_option ("2", layer-wise) with mode: selective: TorchTitan 0.3.0 is per-op
    # only (no AMD example at fd1eeab relies on it)
    "activation_checkpoint": "differs: activation_checkpoint.selective_ac_option=",
}


def _compare(root: Path, key: str, row: list) -> list[str]:
    """The unexplained differences of one table row (empty when Primus trains what AMD Primus does)."""
    path, module = key.rsplit(":", 1)
    keys = amd_table(TORCHTITAN_TABLE)["keys"]
    with contextlib.redirect_stdout(io.StringIO()):
        values, lines, _ = primus_arguments(root / path, keys)
    return unexplained(f"{path}:{module}", keys, row, values[module], lines[module], ANNOUNCED)


def _rows(root: Path) -> list[tuple[str, list]]:
    return [(key, row) for key, row in amd_table(TORCHTITAN_TABLE)["rows"].items()
            if (root / key.rsplit(":", 1)[0]).is_file()]


FIXTURE_ROWS = _rows(FIXTURES)


def test_the_fixtures_cover_the_families_and_the_data_cases():
    names = {key.split("/")[-1].split("-")[0] for key, _ in FIXTURE_ROWS}
    assert {"llama3.1_8B", "llama3.1_70B", "llama3.1_405B", "qwen3_8B", "deepseek_v3_16b", "gpt_oss_20B",
            "llama4_17Bx16E"} <= names
    data = amd_table(TORCHTITAN_TABLE)["keys"].index("data")
    assert {row[data] for _, row in FIXTURE_ROWS} == {"mock", "c4"}  # mock by default, c4 with mock_data: false
    assert any("c4_test" in (FIXTURES / key.rsplit(":", 1)[0]).read_text() and row[data] == "mock"
               for key, row in FIXTURE_ROWS)  # a dataset that AMD's mock data hides


@pytest.mark.parametrize("key, row", FIXTURE_ROWS, ids=[key.split("/", 3)[-1] for key, _ in FIXTURE_ROWS])
def test_primus_trains_what_amd_primus_trains(key, row):
    assert _compare(FIXTURES, key, row) == []


@pytest.mark.skipif(not CHECKOUT, reason="set AMD_PRIMUS_CHECKOUT to an AMD Primus fd1eeab checkout")
def test_every_amd_torchtitan_example_trains_as_amd_primus_does():
    rows = _rows(Path(CHECKOUT))
    assert len(rows) == len(amd_table(TORCHTITAN_TABLE)["rows"]) == 75
    problems = [p for key, row in rows for p in _compare(Path(CHECKOUT), key, row)]
    assert problems == [], "\n".join(problems[:40])


@pytest.mark.e2e
@pytest.mark.skipif(not AMD_MIRROR.is_dir(), reason=f"AMD Primus mirror not available ({AMD_MIRROR})")
def test_the_torchtitan_table_is_a_fresh_generation():
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_amd_resolved.py"), "--git-dir",
                             str(AMD_MIRROR), "--framework", "torchtitan", "--check", "--out-torchtitan",
                             str(TORCHTITAN_TABLE)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
