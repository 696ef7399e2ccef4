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


def fetch(env, local_rank=0, timeout=120, timeouts=(10.0, 30.0, 90.0)):
    """fetch(..., "tokenizer") in a fresh process: huggingface_hub reads HF_ENDPOINT / HF_HOME at import."""
    code = ("import json, os, sys; from primus.compat.hub import HubTimeouts, fetch\n"
            "from primus.config.errors import ConfigError\n"
            "try:\n"
            f"    p = fetch({REPO!r}, 'tokenizer', key='tokenizer_model', local_rank={local_rank}, "
            f"timeouts=HubTimeouts(*{timeouts!r}))\n"
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


@pytest.mark.e2e
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


@pytest.mark.e2e
def test_a_gated_repo_without_hf_token_is_one_line(hub_env):
    with HubServer(REPO, FILES, token="hf_gated_secret") as hub:
        process = fetch(hub_env(hub.endpoint, token=None))
        _, err = process.communicate(timeout=120)
    assert process.returncode == 2
    assert len(err.strip().splitlines()) == 1
    assert f"tokenizer_model: cannot fetch the tokenizer '{REPO}'" in err and "HF_TOKEN" in err


@pytest.mark.e2e
def test_no_network_says_to_point_at_a_local_directory(hub_env):
    process = fetch(hub_env("http://127.0.0.1:9"))  # nothing listens on the discard port
    _, err = process.communicate(timeout=120)
    assert process.returncode == 2
    assert "point tokenizer_model at a local directory holding tokenizer.json" in err
    assert "Traceback" not in err


# -- a Hub in trouble: every request has a connect and read timeout, and the fetch a bound -------------
def _ends_in_one_line(process, bound_s: float) -> str:
    started = time.monotonic()
    _, err = process.communicate(timeout=300)
    assert time.monotonic() - started < bound_s, err  # a hang guard: the timeouts below are seconds
    assert process.returncode == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.mark.e2e
@pytest.mark.parametrize("mode, delay", [("silent", 0), ("slow", 8.0)])
def test_a_hub_that_does_not_answer_in_time_is_one_line(hub_env, mode, delay):
    """The connection is accepted and no byte comes (or comes after 8 s while reads wait 2 s)."""
    with HubServer(REPO, FILES, token="hf_gated_secret", mode=mode, delay_s=delay) as hub:
        line = _ends_in_one_line(fetch(hub_env(hub.endpoint), timeouts=(2.0, 2.0, 6.0)), bound_s=90)
    assert f"tokenizer_model: cannot fetch the tokenizer '{REPO}' from the Hugging Face Hub (no answer from" in line
    assert "timeouts: connect 2 s, read 2 s, no answer 6 s; primus.hub.{connect,read,stall}_timeout_s" in line


@pytest.mark.e2e
def test_a_404_is_one_line(hub_env):
    with HubServer(REPO, FILES, token="hf_gated_secret", mode="404") as hub:
        line = _ends_in_one_line(fetch(hub_env(hub.endpoint)), bound_s=90)
    assert "RepositoryNotFoundError" in line and "point tokenizer_model at a local directory" in line


@pytest.mark.e2e
def test_the_waiting_ranks_end_with_rank_0s_line(hub_env):
    """Rank 0 cannot fetch: the other local ranks of this attempt stop with its line, at once;
    a failure recorded by an earlier attempt does not stop them."""
    with HubServer(REPO, FILES, token="hf_gated_secret", mode="silent") as hub:
        env = {**hub_env(hub.endpoint), "TORCHELASTIC_RUN_ID": "attempt-1"}
        waiting = fetch(env, local_rank=1)
        first = fetch(env, local_rank=0, timeouts=(2.0, 2.0, 4.0))
        line0 = _ends_in_one_line(first, bound_s=90)
        assert _ends_in_one_line(waiting, bound_s=90) == line0
        later = fetch({**env, "TORCHELASTIC_RUN_ID": "attempt-2"}, local_rank=1)
        time.sleep(2.0)
        assert later.poll() is None  # attempt 1's failure is not this attempt's
        later.kill()
        later.communicate()


def test_timeouts_are_settings_with_ranges():
    from primus.compat.hub import HubTimeouts
    from primus.config.schema import PrimusOptions

    options = PrimusOptions(hub={"read_timeout_s": 5})
    assert HubTimeouts.of({"primus": options.model_dump()}) == HubTimeouts(10.0, 5.0, 90.0)
    for bad in ({"read_timeout_s": 0}, {"stall_timeout_s": float("inf")}, {"connect_timeout": 3}):
        with pytest.raises(Exception):
            PrimusOptions(hub=bad)
