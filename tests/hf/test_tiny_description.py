"""A plan builds nothing: it reads the tiny model ``primus.tiny_assets`` will build as what it will be."""
from __future__ import annotations

import pytest

from primus.hf.config import model_spec_from_hf, read_config
from primus.hf.tiny import ensure_tiny_sft_assets, hf_config, tiny_model_dir


def test_the_tiny_model_a_plan_describes_is_the_one_prepare_builds(tmp_path):
    pytest.importorskip("transformers")
    folder = tiny_model_dir(tmp_path)
    planned = hf_config(folder, tmp_path)
    assert not folder.exists()  # described, not built
    ensure_tiny_sft_assets(tmp_path)
    assert model_spec_from_hf(planned) == model_spec_from_hf(read_config(folder))
    assert hf_config(folder, tmp_path) == read_config(folder)  # built: read from the file


def test_another_folder_is_read_from_its_files(tmp_path):
    from primus.config.errors import ConfigError

    with pytest.raises(ConfigError, match="no config.json"):
        hf_config(tmp_path / "elsewhere", tmp_path)
