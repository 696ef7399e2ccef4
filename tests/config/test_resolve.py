"""Extends, presets, the five-layer precedence rule, provenance and schema errors."""
import pytest

from primus.config.errors import ConfigError
from primus.config.resolve import format_why, resolve_experiment
from tests.conftest import write

EXPERIMENT = """\
work_group: team
user_name: me
exp_name: demo
workspace: ./out
modules:
  pre_trainer:
    framework: fake
    config: ./module.yaml
    model: ./model.yaml
    overrides:
      k4: overrides
      k5: overrides
"""


def defaults(framework, stage, *_where):
    return {"k1": "defaults", "k2": "defaults", "k3": "defaults", "k4": "defaults", "k5": "defaults",
            "nested": {"a": 1, "b": 1}}


@pytest.fixture
def experiment(tmp_path):
    write(tmp_path / "module.yaml", "k2: module\nk3: module\nk4: module\nk5: module\nnested: {b: 2}\n")
    write(tmp_path / "model.yaml", "k3: model\nk4: model\nk5: model\n")
    return write(tmp_path / "exp.yaml", EXPERIMENT)


def test_one_precedence_rule_across_all_five_layers(experiment):
    resolved = resolve_experiment(experiment, ["k5=cli"], defaults)
    params = resolved.modules["pre_trainer"].params
    assert [params[f"k{i}"] for i in range(1, 6)] == ["defaults", "module", "model", "overrides", "cli"]
    assert params["nested"] == {"a": 1, "b": 2}  # deep merge keeps untouched siblings


def test_provenance_chain_lists_every_layer_in_order(experiment):
    resolved = resolve_experiment(experiment, ["--k5", "cli"], defaults)
    chain = resolved.provenance.chain("modules.pre_trainer.k5")
    assert [s.label for s in chain] == ["backend defaults", "module preset", "model preset",
                                        "experiment overrides", "command line"]
    assert chain[1].where.endswith("module.yaml:4")
    assert chain[2].where.endswith("model.yaml:3")
    assert chain[3].where.endswith("exp.yaml:12")
    why = format_why(resolved, "k5")
    assert why.splitlines()[-1].lstrip().startswith("=> 'cli'")
    assert "module.yaml:4" in why and "exp.yaml:12" in why


def test_cli_routes_experiment_keys_and_module_keys(experiment):
    resolved = resolve_experiment(experiment, ["exp_name=other", "modules.pre_trainer.k1=x", "--nested.a=5"], defaults)
    assert resolved.spec.exp_name == "other"
    params = resolved.modules["pre_trainer"].params
    assert params["k1"] == "x" and params["nested"]["a"] == 5


def test_extends_child_wins_and_lists_apply_in_order(tmp_path):
    write(tmp_path / "a.yaml", "x: a\ny: a\nz: a\n")
    write(tmp_path / "b.yaml", "y: b\nz: b\n")
    write(tmp_path / "module.yaml", "extends: [a.yaml, b.yaml]\nz: module\n")
    write(tmp_path / "model.yaml", "{}\n")
    exp = write(tmp_path / "exp.yaml", EXPERIMENT)
    params = resolve_experiment(exp, [], defaults).modules["pre_trainer"].params
    assert (params["x"], params["y"], params["z"]) == ("a", "b", "module")


def test_experiment_extends(tmp_path):
    write(tmp_path / "module.yaml", "{}\n")
    write(tmp_path / "model.yaml", "{}\n")
    write(tmp_path / "base.yaml", EXPERIMENT)
    exp = write(tmp_path / "exp.yaml", "extends: base.yaml\nexp_name: child\n")
    assert resolve_experiment(exp, [], defaults).spec.exp_name == "child"


def test_extends_cycle_names_the_cycle(tmp_path):
    write(tmp_path / "a.yaml", "extends: b.yaml\n")
    write(tmp_path / "b.yaml", "extends: a.yaml\n")
    with pytest.raises(ConfigError, match=r"extends cycle: .*a.yaml -> .*b.yaml -> .*a.yaml"):
        resolve_experiment(tmp_path / "a.yaml", [], defaults)


@pytest.mark.parametrize("reference", ["../../etc/passwd", "../../../../etc/hosts", "sub/../../../x"])
def test_preset_names_cannot_escape_the_preset_folders(tmp_path, reference):
    exp = write(tmp_path / "exp.yaml", EXPERIMENT.replace("./model.yaml", reference))
    write(tmp_path / "module.yaml", "{}\n")
    with pytest.raises(ConfigError, match=r"escapes the preset folder"):
        resolve_experiment(exp, [], defaults)


def test_unknown_preset_name_suggests_the_closest(tmp_path):
    exp = write(tmp_path / "exp.yaml", EXPERIMENT.replace("framework: fake", "framework: torchtitan")
                .replace("./module.yaml", "pre_traner.yaml").replace("./model.yaml", "llama3_tiny.yaml"))
    with pytest.raises(ConfigError, match=r"exp.yaml:8: unknown module preset 'pre_traner.yaml'.*did you mean 'pre_trainer.yaml'"):
        resolve_experiment(exp, [], defaults)


def test_unknown_key_gives_file_line_and_did_you_mean(tmp_path):
    exp = write(tmp_path / "exp.yaml", EXPERIMENT.replace("exp_name: demo", "exp_nme: demo"))
    with pytest.raises(ConfigError, match=r"exp.yaml:3: unknown key 'exp_nme' \(did you mean 'exp_name'\?\)"):
        resolve_experiment(exp, [], defaults)


def test_unknown_module_key_and_wrong_type(tmp_path):
    exp = write(tmp_path / "exp.yaml", EXPERIMENT.replace("    framework: fake", "    framwork: fake\n    framework: fake"))
    with pytest.raises(ConfigError, match=r"unknown key 'modules.pre_trainer.framwork' \(did you mean 'framework'\?\)"):
        resolve_experiment(exp, [], defaults)
    exp = write(tmp_path / "exp.yaml", EXPERIMENT)
    with pytest.raises(ConfigError, match=r"command line '--modules.pre_trainer.stage=\[1\]'.*modules.pre_trainer.stage"):
        resolve_experiment(exp, ["--modules.pre_trainer.stage=[1]"], defaults)


def test_run_names_cannot_be_paths(tmp_path):
    exp = write(tmp_path / "exp.yaml", EXPERIMENT)
    with pytest.raises(ConfigError, match=r"exp_name="):
        resolve_experiment(exp, ["exp_name=../../escape"], defaults)
