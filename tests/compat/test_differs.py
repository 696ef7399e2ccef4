"""``differs:`` lines: an AMD Primus-format experiment whose literal values do not all run says so, one line per
key, at ``config validate``, ``plan`` and ``train --dry-run``."""
import pytest
import yaml

from primus.cli.main import main

EXPECTED = [
    # AMD Primus drops norm_epsilon (not a Megatron-LM dest): Megatron-LM's default runs, there as here
    "differs: norm_epsilon=1e-06 → layernorm_epsilon=1e-05 runs (AMD Primus drops norm_epsilon",
    # AMD's model presets turn sequence parallelism on; Megatron-LM turns it off at TP 1
    "differs: sequence_parallel=true → sequence_parallel=false runs (tensor_model_parallel_size is 1",
    # 10 layers on 4 stages: a split is derived
    "differs: pipeline_model_parallel_layout=null → pipeline_model_parallel_layout=Et*2|t*3|t*3|t*2,L runs",
]


def _experiment(tmp_path, **overrides):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({
        "work_group": "t", "user_name": "t", "exp_name": "differs", "workspace": str(tmp_path / "out"),
        "modules": {"pre_trainer": {"framework": "megatron", "config": "pre_trainer.yaml", "model": "qwen3_8B.yaml",
                                    "overrides": {"norm_epsilon": 1.0e-6, "num_layers": 10, "hidden_size": 256,
                                                  "ffn_hidden_size": 512, "num_attention_heads": 4,
                                                  "num_query_groups": 2, "pipeline_model_parallel_size": 4,
                                                  "mock_data": True, "tokenizer_type": "NullTokenizer",
                                                  **overrides}}}}))
    return path


@pytest.fixture
def amd_experiment(tmp_path):
    """AMD Primus's format: it carries an AMD Primus-only key (stderr_sink_level)."""
    return _experiment(tmp_path, stderr_sink_level="INFO")


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("differs:")]


def _check(lines: list[str]) -> None:
    for expected in EXPECTED:
        assert sum(line.startswith(expected) for line in lines) == 1, (expected, lines)
    assert not any(line.startswith("translated norm_epsilon") for line in lines)


def test_validate_says_each_difference(amd_experiment, capsys):
    assert main(["config", "validate", str(amd_experiment)]) == 0
    out = capsys.readouterr().out
    _check(_lines(out))
    assert "translated norm_epsilon" not in out  # a change of meaning is never called a translation


def test_plan_says_each_difference_on_stderr(amd_experiment, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    main(["plan", str(amd_experiment), "--json"])
    captured = capsys.readouterr()
    _check(_lines(captured.err))
    assert "differs:" not in captured.out  # --json stays JSON


def test_dry_run_says_each_difference(amd_experiment, capsys):
    assert main(["train", str(amd_experiment), "--dry-run", "--nproc-per-node", "8"]) == 0
    _check(_lines(capsys.readouterr().out))


def test_a_primus_experiment_gets_its_norm_epsilon(tmp_path, capsys):
    """No AMD Primus-only key: Primus's format; norm_epsilon is Megatron-LM's --norm-epsilon and runs."""
    from primus.launch.experiment import resolve

    path = _experiment(tmp_path)
    resolved = resolve(path, [])
    assert resolved.modules["pre_trainer"].params["layernorm_epsilon"] == 1.0e-6
    assert main(["config", "validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "translated norm_epsilon=1e-06 → layernorm_epsilon=1e-06" in out
    assert not any(line.startswith("differs: norm_epsilon") for line in _lines(out))


def test_an_amd_experiment_reads_amd_module_defaults_and_ours_read_ours(tmp_path, amd_experiment):
    """AMD Primus's pre_trainer.yaml (eval_iters 0, lr 2e-5) for its files; Primus's for Primus's."""
    from primus.launch.experiment import resolve

    amd = resolve(amd_experiment, []).modules["pre_trainer"].params
    assert (amd["eval_iters"], amd["lr"], amd["distributed_timeout_minutes"]) == (0, 2.0e-5, 60)
    assert "layernorm_epsilon" not in amd
    (tmp_path / "ours").mkdir()
    ours = resolve(_experiment(tmp_path / "ours"), []).modules["pre_trainer"].params
    assert (ours["eval_iters"], ours["lr"]) == (10, 3.0e-4)


def test_an_mtp_placement_is_said_in_full(tmp_path, capsys):
    """A layout without the MTP layer: the line says the whole layout that runs, not a cut one."""
    path = _experiment(tmp_path, stderr_sink_level="INFO", mtp_num_layers=1, num_layers=16,
                       pipeline_model_parallel_layout="Et*4|t*4|t*4|t*4,L")
    assert main(["config", "validate", str(path)]) == 0
    lines = [line for line in _lines(capsys.readouterr().out) if line.startswith("differs: pipeline_model")]
    assert len(lines) == 1 and "→ pipeline_model_parallel_layout=Et*4|t*4|t*4|t*4,m,L runs" in lines[0] and "..." not in lines[0], lines
