import pytest

from primus.config.errors import ConfigError
from primus.config.interpolate import interpolate_string
from primus.config.yaml_source import load_yaml_layer
from tests.conftest import write


def test_default_is_typed_when_unset():
    assert interpolate_string("${PRIMUS_T_STEPS:20}", "x", env={}) == 20
    assert interpolate_string("${PRIMUS_T_FLAG:true}", "x", env={}) is True
    assert interpolate_string("${PRIMUS_T_LR:3.0e-4}", "x", env={}) == pytest.approx(3e-4)
    assert interpolate_string("${PRIMUS_T_NAME:}", "x", env={}) == ""


def test_environment_wins_over_default_and_is_typed():
    assert interpolate_string("${STEPS:20}", "x", env={"STEPS": "7"}) == 7
    assert interpolate_string("${NAME:x}", "x", env={"NAME": "llama"}) == "llama"


def test_embedded_reference_is_text():
    assert interpolate_string("${ROOT:/data}/c4/${SPLIT:train}", "x", env={"SPLIT": "val"}) == "/data/c4/val"
    assert interpolate_string("run-${N:3}", "x", env={}) == "run-3"


def test_unset_variable_without_default_names_file_and_line(tmp_path, monkeypatch):
    monkeypatch.delenv("PRIMUS_T_MISSING", raising=False)
    path = write(tmp_path / "exp.yaml", "a: 1\nb:\n  c: ${PRIMUS_T_MISSING}\n")
    with pytest.raises(ConfigError, match=r"exp.yaml:3: environment variable PRIMUS_T_MISSING is not set"):
        load_yaml_layer(path, "experiment")


def test_layer_records_lines_and_templates(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_T_TOKEN", "s3cret")
    path = write(tmp_path / "exp.yaml", "top: 1\nnested:\n  deep:\n    token: ${PRIMUS_T_TOKEN}\n")
    layer = load_yaml_layer(path, "experiment")
    assert layer.data["nested"]["deep"]["token"] == "s3cret"
    assert layer.origins["nested.deep.token"].endswith("exp.yaml:4")
    assert layer.templates["nested.deep.token"] == "${PRIMUS_T_TOKEN}"


@pytest.mark.parametrize("text, message", [
    ("a: [1, 2\n", r"exp.yaml:2: invalid YAML"),
    ("a: 1\na: 2\n", r"exp.yaml:2: duplicate key 'a'"),
    ("- 1\n- 2\n", r"exp.yaml:1: expected a mapping"),
])
def test_malformed_yaml_names_the_line(tmp_path, text, message):
    path = write(tmp_path / "exp.yaml", text)
    with pytest.raises(ConfigError, match=message):
        load_yaml_layer(path, "experiment")
