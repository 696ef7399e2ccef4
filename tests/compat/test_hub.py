"""A tokenizer named by Hub id is fetched once, with HF_TOKEN, from a real HTTP server (HF_ENDPOINT)."""
import json
import os
import subprocess
import sys
import time

import pytest

from primus.compat.hub import is_hub_id
from tests.compat.hub_server import HubServer
from tests.conftest import ROOT

FILES = {"tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}',
         "tokenizer_config.json": b'{"eos_token": "</s>"}',
         "model-00001-of-00004.safetensors": b"weights" * 100}
REPO = "acme/Tiny-LLM-3B"


def fetch(env, local_rank=0, timeout=120):
    """fetch(..., "tokenizer") in a fresh process: huggingface_hub reads HF_ENDPOINT / HF_HOME at import."""
    code = ("import json, os, sys; from primus.compat.hub import fetch\n"
            "from primus.config.errors import ConfigError\n"
            "try:\n"
            f"    p = fetch({REPO!r}, 'tokenizer', key='tokenizer_model', local_rank={local_rank})\n"
            "    print(json.dumps({'path': str(p), 'files': sorted(os.listdir(p))}))\n"
            "except ConfigError as exc:\n"
            "    print(exc, file=sys.stderr); sys.exit(2)\n")
    return subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.fixture
def hub_env(tmp_path):
    def make(endpoint, token="hf_gated_secret"):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_TELEMETRY="1")
        if token:
            env["HF_TOKEN"] = token
        return env
    return make


def test_hub_ids_and_paths():
    assert is_hub_id("meta-llama/Llama-3.1-8B") and is_hub_id("Qwen/Qwen2.5-7B")
    assert not is_hub_id("./assets/hf/Llama-3.1-8B") and not is_hub_id("/abs/dir") and not is_hub_id("plain")
    assert not is_hub_id(str(ROOT / "primus"))  # an existing directory is a path


def test_local_rank_0_fetches_the_tokenizer_once_and_the_others_wait(hub_env):
    with HubServer(REPO, FILES, token="hf_gated_secret") as hub:
        env = hub_env(hub.endpoint)
        waiting = fetch(env, local_rank=1)  # starts first, must wait for rank 0
        time.sleep(1.0)
        assert waiting.poll() is None
        first = fetch(env, local_rank=0)
        out0, err0 = first.communicate(timeout=120)
        out1, _ = waiting.communicate(timeout=120)
        assert first.returncode == 0, err0
        result = json.loads(out0)
        assert result["files"] == ["tokenizer.json", "tokenizer_config.json"]  # no weights
        assert json.loads(out1)["path"] == result["path"]
        gets = [r for r in hub.requests if r.startswith("GET") and "/resolve/" in r]
        assert len(gets) == 2
        again = fetch(env, local_rank=0)  # cached: no download the second time
        assert again.communicate(timeout=120)[0] and again.returncode == 0
        assert len([r for r in hub.requests if r.startswith("GET") and "/resolve/" in r]) == 2


def test_a_gated_repo_without_hf_token_is_one_line(hub_env):
    with HubServer(REPO, FILES, token="hf_gated_secret") as hub:
        process = fetch(hub_env(hub.endpoint, token=None))
        _, err = process.communicate(timeout=120)
    assert process.returncode == 2
    assert len(err.strip().splitlines()) == 1
    assert f"tokenizer_model: cannot fetch the tokenizer '{REPO}'" in err and "HF_TOKEN" in err


def test_no_network_says_to_point_at_a_local_directory(hub_env):
    process = fetch(hub_env("http://127.0.0.1:9"))  # nothing listens on the discard port
    _, err = process.communicate(timeout=120)
    assert process.returncode == 2
    assert "point tokenizer_model at a local directory holding tokenizer.json" in err
    assert "Traceback" not in err
