"""AMD Primus's experiment format resolves into ours: bases:, AMD-only keys, one line per key, --why."""
import pytest

from primus.config.errors import ConfigError
from primus.compat import AMD_PRIMUS
from primus.config.resolve import format_why, resolve_experiment
from tests.conftest import write

# A Megatron experiment in AMD Primus's format, written for these tests (not copied from AMD).
AMD_MEGATRON = """\
work_group: AMD
user_name: root
exp_name: amd_format
workspace: ./output
modules:
  pre_trainer:
    framework: megatron
    config: ./module.yaml
    overrides:
      stderr_sink_level: DEBUG
      log_avg_skip_iterations: 2
      log_avg_reset_interval: 50
      disable_last_saving: true
      auto_continue_train: false
      enable_primus_turbo: true
      use_turbo_attention: false
      train_iters: 5
"""


def resolve(tmp_path, text, module="lr: 1.0\n", cli=None):
    write(tmp_path / "module.yaml", module)
    return resolve_experiment(write(tmp_path / "exp.yaml", text), cli or [], dialect=AMD_PRIMUS)


def test_bases_is_extends(tmp_path):
    write(tmp_path / "base.yaml", "a: base\nb: base\n")
    write(tmp_path / "mid.yaml", "bases: [base.yaml]\nb: mid\n")
    text = AMD_MEGATRON.replace("./module.yaml", "./mid.yaml")
    params = resolve(tmp_path, text).modules["pre_trainer"].params
    assert (params["a"], params["b"]) == ("base", "mid")


def test_extends_and_bases_together_is_one_error(tmp_path):
    write(tmp_path / "base.yaml", "a: 1\n")
    write(tmp_path / "both.yaml", "extends: base.yaml\nbases: base.yaml\n")
    with pytest.raises(ConfigError, match=r"both.yaml:2: both extends and bases are set"):
        resolve(tmp_path, AMD_MEGATRON.replace("./module.yaml", "./both.yaml"))


def test_amd_keys_become_primus_settings_with_one_line_each(tmp_path):
    resolved = resolve(tmp_path, AMD_MEGATRON)
    module = resolved.modules["pre_trainer"]
    params = module.params
    assert resolved.spec.logging.level == "DEBUG"
    assert params["primus"] == {"avg_skip_steps": 2, "avg_window": 50, "save_last_checkpoint": False}
    for key in ("stderr_sink_level", "log_avg_skip_iterations", "disable_last_saving", "enable_primus_turbo",
                "auto_continue_train", "use_turbo_attention"):
        assert key not in params
    lines = [t.line() for t in module.translations]
    assert len(lines) == 7  # one per AMD key
    assert "translated stderr_sink_level=DEBUG → logging.level=DEBUG (" in lines[0]
    assert any(line.startswith("translated disable_last_saving=true → primus.save_last_checkpoint=false (")
               for line in lines)
    assert any(line.startswith("translated enable_primus_turbo=true → stock kernel here (") for line in lines)
    assert params["train_iters"] == 5 and params["lr"] == 1.0  # Megatron-LM's own keys are left alone


def test_why_shows_both_names(tmp_path):
    resolved = resolve(tmp_path, AMD_MEGATRON)
    ours = format_why(resolved, "primus.save_last_checkpoint")
    assert "as disable_last_saving" in ours and "exp.yaml:13" in ours
    theirs = format_why(resolved, "disable_last_saving")
    assert "exp.yaml:13" in theirs and "AMD Primus name → primus.save_last_checkpoint=false" in theirs


def test_the_translation_is_saved_with_the_resolved_config(tmp_path):
    tree = resolve(tmp_path, AMD_MEGATRON).tree()
    saved = tree["modules"]["pre_trainer"]["translated"]
    assert {"from": "disable_last_saving", "value": True, "to": "primus.save_last_checkpoint", "to_value": False,
            "kind": "rename"}.items() <= saved[3].items()


def test_our_name_on_the_command_line_beats_their_name_in_the_file(tmp_path):
    resolved = resolve(tmp_path, AMD_MEGATRON, cli=["primus.save_last_checkpoint=true"])
    module = resolved.modules["pre_trainer"]
    assert module.params["primus"]["save_last_checkpoint"] is True
    line = next(t.line() for t in module.translations if t.source == "disable_last_saving")
    assert "command line 'primus.save_last_checkpoint=true' sets primus.save_last_checkpoint and wins" in line


def test_both_names_in_one_file_is_one_error(tmp_path):
    text = AMD_MEGATRON + "      primus: {save_last_checkpoint: true}\n"
    with pytest.raises(ConfigError, match=r"exp.yaml:13: modules.pre_trainer.disable_last_saving: is AMD Primus's "
                                          r"name for primus.save_last_checkpoint, which .*exp.yaml:18 also sets"):
        resolve(tmp_path, text)


def test_sink_level_wins_over_stderr_sink_level(tmp_path):
    text = AMD_MEGATRON.replace("      stderr_sink_level: DEBUG\n", "      sink_level: WARNING\n"
                                "      stderr_sink_level: DEBUG\n")
    assert resolve(tmp_path, text).spec.logging.level == "WARNING"


def test_a_bad_log_level_names_its_line(tmp_path):
    with pytest.raises(ConfigError, match=r"exp.yaml:10: modules.pre_trainer.stderr_sink_level: log level 'LOUD'"):
        resolve(tmp_path, AMD_MEGATRON.replace("DEBUG", "LOUD"))


def test_a_preset_names_the_stage_and_an_explicit_stage_must_agree(tmp_path):
    assert resolve(tmp_path, AMD_MEGATRON, module="stage: sft\n").modules["pre_trainer"].stage == "sft"
    text = AMD_MEGATRON.replace("    config: ./module.yaml\n", "    config: ./module.yaml\n    stage: pretrain\n")
    with pytest.raises(ConfigError, match=r"module.yaml:1: modules.pre_trainer.stage: stage 'sft' contradicts"):
        resolve(tmp_path, text, module="stage: sft\n")


def test_a_feature_this_primus_cannot_build_is_refused_by_name(tmp_path):
    text = AMD_MEGATRON + "      hc_mult: 4\n"
    with pytest.raises(ConfigError, match=r"exp.yaml:18: modules.pre_trainer.hc_mult: AMD Primus option not "
                                          r"supported here: DeepSeek-V4 models"):
        resolve(tmp_path, text)


def test_our_own_experiments_have_no_translations():
    from tests.conftest import ROOT

    for example in sorted((ROOT / "examples").glob("*/*.yaml")):
        resolved = resolve_experiment(example, [], dialect=AMD_PRIMUS)
        assert all(not m.translations for m in resolved.modules.values()), example
