"""Secret keys are recognised by whole words, and saving a config never changes a non-secret value."""
import pytest

from primus.config.resolve import resolve_experiment
from primus.config.secrets import is_secret_key, is_secret_name, restore_secrets
from primus.runtime.registry import backend_defaults
from primus.runtime.rundir import RunDir

from tests.conftest import ROOT, write

SHIPPED = sorted([*(ROOT / "examples").rglob("*.yaml"),
                  *(ROOT / "benchmarks" / "configs").glob("*.yaml")])


@pytest.mark.parametrize("key", ["hf_token", "token", "modules.x.primus.hf_token", "access_token", "wandb_api_key",
                                 "api_key", "apikey", "client_secret", "secret", "db_password", "passwd",
                                 "aws_secret_access_key", "private_key", "credentials"])
def test_secret_keys(key):
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["tokenizer_type", "tokenizer_model", "tokenizer", "tokenizer_hf_use_fast",
                                 "fim_pad_token", "fim_eod_token", "eos_token", "pad_token", "rl_skip_bos_token",
                                 "max_tokens", "num_tokens", "tiktoken_pattern", "tokens_per_sec",
                                 "allow_ambiguous_pad_tokens", "keyboard", "monkey", "secretary_count_x"])
def test_not_secret_keys(key):
    assert not is_secret_key(key)


@pytest.mark.parametrize("name", ["HF_TOKEN", "WANDB_API_KEY", "GITHUB_TOKEN", "S3_SECRET", "DB_PASSWORD",
                                  "OPENAI_API_KEY", "SSH_KEY", "PRIMUS_SECRET_X", "modules.m.HF_TOKEN", "hf_token"])
def test_secret_names_keys_and_environment_variables(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["tokenizer_type", "TOKENIZER_TYPE", "HSA_NO_SCRATCH_RECLAIM", "NCCL_IB_HCA",
                                  "moe_token_dispatcher_type", "eos_token", "NUM_TOKENS", "keyboard"])
def test_not_secret_names(name):
    assert not is_secret_name(name)


def _saved_and_read_back(resolved, run_dir, monkeypatch):
    """What the launcher saves and a worker (with the launcher's environment) reads back."""
    run_dir.mkdir(parents=True)
    tree, env = resolved.saved_tree()
    RunDir(run_dir).write_config(tree)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return restore_secrets(RunDir(run_dir).read_config())


@pytest.mark.parametrize("example", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_example_round_trips_through_save_and_worker_read(example, tmp_path, monkeypatch):
    """What a worker reads back is what was resolved: the Megatron worker failed its own validation
    when `tokenizer_type: HuggingFaceTokenizer` was saved as <redacted>."""
    monkeypatch.chdir(ROOT)
    resolved = resolve_experiment(example, [], backend_defaults)
    assert _saved_and_read_back(resolved, tmp_path / "run", monkeypatch) == resolved.tree()


def test_tokenizer_keys_survive_and_a_literal_secret_does_not(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    exp = write(tmp_path / "exp.yaml", (ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml").read_text())
    resolved = resolve_experiment(exp, ["tokenizer_type=HuggingFaceTokenizer", "tokenizer_model=/tok",
                                        "primus.hf_token=hf_literalSECRET"], backend_defaults)
    text = (tmp_path / "run" / "config.resolved.yaml")
    back = _saved_and_read_back(resolved, tmp_path / "run", monkeypatch)
    params = back["modules"]["pre_trainer"]["params"]
    assert params["tokenizer_type"] == "HuggingFaceTokenizer" and params["tokenizer_model"] == "/tok"
    assert "hf_literalSECRET" not in text.read_text()
    assert "hf_token: ${PRIMUS_SECRET_PRE_TRAINER_PRIMUS_HF_TOKEN}" in text.read_text()
    assert params["primus"]["hf_token"] == "hf_literalSECRET"  # the worker gets it back intact
