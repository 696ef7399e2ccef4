"""Validation quality for AMD Primus files: every key checked, the right did-you-mean, file:line always."""
import pytest

from primus.cli.main import main
from primus.config.synonyms import synonym_in
from primus.config.errors import did_you_mean
from tests.conftest import write

HEAD = """\
work_group: AMD
user_name: root
exp_name: check
workspace: ./output
modules:
  pre_trainer:
"""


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_typo_is_caught_without_the_engine_with_the_right_suggestion(tmp_path, capsys):
    exp = write(tmp_path / "exp.yaml", HEAD + "    framework: megatron\n    config: pre_trainer.yaml\n"
                "    overrides:\n      num_layers: 2\n      hidden_size: 64\n      num_attention_heads: 4\n"
                "      mock_date: true\n")
    code, out, err = run(capsys, "config", "validate", "--no-engine", exp)
    assert code == 2 and not out
    assert err.count("\n") == 1
    assert "exp.yaml:13: modules.pre_trainer.mock_date:" in err and "did you mean 'mock_data'?" in err


@pytest.mark.parametrize("word, expected", [
    ("rope_theta", "rotary_base"), ("n_kv_heads", "num_query_groups"), ("expert_parallel_degree",
                                                                         "expert_model_parallel_size"),
    ("norm_eps", "layernorm_epsilon"), ("warmup_steps", "lr_warmup_iters"), ("num_local_experts", "num_moe_experts"),
])
def test_another_engines_name_points_at_ours(word, expected):
    megatron_names = ["rotary_base", "num_query_groups", "expert_model_parallel_size", "layernorm_epsilon",
                      "lr_warmup_iters", "num_moe_experts", "num_layers", "pipeline_model_parallel_size"]
    assert did_you_mean(word, megatron_names) == f" (did you mean '{expected}'?)"


def test_synonyms_go_both_ways_and_spelling_falls_back_to_difflib():
    assert synonym_in("rotary_base", ["rope_theta", "dim"]) == "rope_theta"
    assert synonym_in("mock_date", ["mock_data"]) is None
    assert did_you_mean("mock_date", ["mock_data", "data_path"]) == " (did you mean 'mock_data'?)"


def test_other_trainers_are_refused_in_one_line_before_their_keys(tmp_path, capsys):
    exp = write(tmp_path / "exp.yaml", HEAD + "    framework: maxtext\n    config: pre_trainer.yaml\n"
                "env:\n  XLA_FLAGS: x\n")
    code, _, err = run(capsys, "config", "validate", exp)
    assert code == 2 and err.count("\n") == 1
    assert "exp.yaml:7: framework 'maxtext': MaxText is a JAX trainer" in err


def test_a_model_family_primus_does_not_build_is_named(tmp_path, capsys):
    exp = write(tmp_path / "exp.yaml", HEAD + "    framework: megatron\n    config: pre_trainer.yaml\n"
                "    model: zebra_llama_1B.yaml\n")
    code, _, err = run(capsys, "config", "validate", exp)
    assert code == 2 and err.count("\n") == 1
    assert "exp.yaml:9: model preset 'zebra_llama_1B.yaml': Mamba / hybrid models" in err


def test_trainer_class_is_refused_by_name(tmp_path, capsys):
    exp = write(tmp_path / "exp.yaml", HEAD + "    framework: megatron\n    config: pre_trainer.yaml\n"
                "    trainer_class: MegatronPretrainTrainer\n")
    code, _, err = run(capsys, "config", "validate", exp)
    assert code == 2 and err.count("\n") == 1
    assert "exp.yaml:9: modules.pre_trainer.trainer_class: AMD Primus's trainer class 'MegatronPretrainTrainer'" in err


def test_automodel_errors_name_their_line(tmp_path, capsys):
    pytest.importorskip("nemo_automodel")
    exp = write(tmp_path / "exp.yaml", HEAD + "    framework: nemo_automodel\n    config: pre_trainer.yaml\n"
                "    model: wan2_2_t2v_a14b.yaml\n    overrides:\n      model:\n        stage: medium_noise\n"
                "      flow_matching:\n        flow_shfit: 3.0\n")
    code, _, err = run(capsys, "config", "validate", exp)
    assert code == 2 and "exp.yaml:12: model.stage='medium_noise' must be one of" in err
    exp.write_text(exp.read_text().replace("medium_noise", "low_noise"))
    code, _, err = run(capsys, "config", "validate", exp)
    assert code == 2
    assert "exp.yaml:14: unknown AutoModel key 'flow_matching.flow_shfit' (did you mean 'flow_shift'?)" in err


def test_plan_errors_name_their_line(tmp_path, capsys):
    exp = write(tmp_path / "exp.yaml", HEAD + "    framework: megatron\n    config: pre_trainer.yaml\n"
                "    model: llama3_tiny.yaml\n    overrides:\n      tensor_model_paralel_size: 2\n")
    code, _, err = run(capsys, "plan", exp)
    assert code == 2 and err.count("\n") == 1
    assert "exp.yaml:11: modules.pre_trainer.tensor_model_paralel_size:" in err
    assert "did you mean 'tensor_model_parallel_size'?" in err


@pytest.mark.parametrize("framework, preset, expected", [
    ("megatron", "qwen3_5_35B_A3B.yaml", "Qwen3.5 (Gated DeltaNet linear attention"),
    ("megatron", "glm5.yaml", "GLM-5 (DeepSeek Sparse Attention"),
    ("megatron", "minimax_m2.5.yaml", "MiniMax-M2.5 normalises q and k over all heads"),
])
def test_amd_model_families_this_primus_cannot_build_are_named(tmp_path, capsys, framework, preset, expected):
    exp = write(tmp_path / "exp.yaml", HEAD + f"    framework: {framework}\n    config: pre_trainer.yaml\n"
                f"    model: {preset}\n")
    code, _, err = run(capsys, "config", "validate", exp)
    assert code == 2 and err.count("\n") == 1
    assert f"exp.yaml:9: model preset '{preset}': {expected}" in err
