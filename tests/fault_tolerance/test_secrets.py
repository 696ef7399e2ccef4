"""Secrets reach the workers intact and appear nowhere else.

Planted secrets never appear in logs, configs, manifests, dry-run output or preflight reports.
A planted literal token appears in no file of the run dir, no dry-run output, no error line; the
workers still receive it."""
import json

import pytest

from tests.conftest import TINY_EXAMPLE, write
from tests.helpers import primus_in_workspace

SECRETS = {"HF_TOKEN": "hf_PLANTEDsecret0001", "WANDB_API_KEY": "PLANTEDsecret0002",
           "PRIMUS_T_SECRET": "PLANTEDsecret0003", "DB_PASSWORD": "PLANTEDsecret0004"}


def _leaks(text: str) -> list[str]:
    return [value for value in SECRETS.values() if value in text]


def _with_hf_token_reference(text: str) -> str:
    return text.replace("        tiny_assets:", '        hf_token: "${HF_TOKEN}"\n        tiny_assets:')


@pytest.fixture(scope="module")
def secret_run(tmp_path_factory, tiny_cache):
    """One real 2-step run that two tests read: ``hf_token: ${HF_TOKEN}`` with SECRETS in the environment,
    and AMD's environment keys (AMD_ENV_SECRETS) among the module's settings. Its workspace and console."""
    tmp = tmp_path_factory.mktemp("secret-run")
    exp = _with_amd_environment_keys(tmp, _with_hf_token_reference(TINY_EXAMPLE.read_text()))
    result = primus_in_workspace(tmp / "ws", tiny_cache, "train", exp, "exp_name=secrets", "training.steps=2",
                                 env=SECRETS)
    assert result.returncode == 0, result.stderr[-2000:]
    return tmp / "ws", result


@pytest.mark.e2e
def test_no_planted_secret_in_any_output(secret_run, run_primus, workspace, tmp_path):
    exp = write(tmp_path / "exp.yaml", _with_hf_token_reference(TINY_EXAMPLE.read_text()))
    trained, train = secret_run
    outputs = [train.stdout, train.stderr]
    for args in (["config", "show", exp], ["train", exp, "--dry-run"],
                 ["preflight", "--quick", "--tests", "gemm", "--report-dir", tmp_path / "preflight"]):
        result = run_primus(*args, env=SECRETS)
        assert result.returncode == 0, result.stderr[-2000:]
        outputs += [result.stdout, result.stderr]
    assert not _leaks("\n".join(outputs))
    files = [p for root in (trained, workspace, tmp_path / "preflight") if root.exists()
             for p in root.rglob("*") if p.is_file()]
    assert any(p.name == "config.resolved.yaml" for p in files) and any(p.name.endswith(".pdf") for p in files)
    leaked = {str(p): _leaks(p.read_bytes().decode("utf-8", "replace")) for p in files}
    assert not {k: v for k, v in leaked.items() if v}
    resolved = next(p for p in files if p.name == "config.resolved.yaml").read_text()
    assert "hf_token: ${HF_TOKEN}" in resolved  # saved as the reference, re-read by workers


FILE_LITERAL = "hf_PLANTEDliteralFILE01"
CLI_LITERAL = "hf_PLANTEDliteralCLI002"
PROBE = '''import atexit, hashlib, os
if os.environ.get("RANK") is not None and os.environ.get("PRIMUS_T_PROBE"):
    def _probe():
        with open(os.path.join(os.environ["PRIMUS_T_PROBE"], "rank" + os.environ["RANK"]), "w") as out:
            out.write(hashlib.sha256(os.environ.get("HF_TOKEN", "").encode()).hexdigest())
    atexit.register(_probe)
'''


@pytest.mark.e2e
def test_a_literal_secret_reaches_the_workers_and_nothing_else(run_primus, workspace, tmp_path, monkeypatch):
    """A token written literally in the file, or given on the command line, is in no file of the
    run dir, no dry-run output (local, Slurm, srun, container), no error line, and each real
    worker process still reads it (a probe in the workers records its hash)."""
    import hashlib

    monkeypatch.delenv("HF_TOKEN", raising=False)
    exp = write(tmp_path / "exp.yaml", TINY_EXAMPLE.read_text().replace(
        "        tiny_assets:", f"        hf_token: {FILE_LITERAL}\n        tiny_assets:"))
    probe = tmp_path / "probe"
    probe.mkdir()
    write(tmp_path / "site" / "sitecustomize.py", PROBE)
    env = {"PRIMUS_T_PROBE": str(probe), "PYTHONPATH": str(tmp_path / "site"), "PRIMUS_USER_CONFIG": "/nonexistent",
           "SLURM_JOB_ID": ""}
    secret = f"primus.hf_token={CLI_LITERAL}"
    outputs = []
    for args, code in (
            (["config", "show", exp], 0), (["config", "show", exp, "--why", "primus.hf_token", secret], 0),
            (["train", exp, "--dry-run", secret], 0), (["train", exp, "--slurm", "-N", "2", "--dry-run", secret], 0),
            (["train", exp, "--container", "img:1", "--container-engine", "docker", "--dry-run", secret], 0),
            (["config", "validate", exp, f"primus.hf_token=[{CLI_LITERAL}]"], 2),
            (["train", exp, "--nproc-per-node", "2", "exp_name=literal", "training.steps=1", secret], 0)):
        starts_ranks = "--nproc-per-node" in args  # the probe is a sitecustomize: run at each rank's start
        without_probe = {key: value for key, value in env.items() if key != "PYTHONPATH"}
        result = run_primus(*args, env=env if starts_ranks else without_probe, fresh=starts_ranks)
        assert result.returncode == code, result.stderr[-2000:]
        outputs.append(result.stdout + result.stderr)
    srun = run_primus("train", exp, "--srun", "--dry-run", secret, env={**env, "SLURM_JOB_ID": "7",
                                                                        "SLURM_JOB_NUM_NODES": "2"})
    assert srun.returncode == 0, srun.stderr[-2000:]
    outputs.append(srun.stdout + srun.stderr)
    text = "\n".join(outputs)
    assert FILE_LITERAL not in text and CLI_LITERAL not in text
    assert text.count("primus.hf_token=${PRIMUS_SECRET_PRIMUS_HF_TOKEN}") >= 3  # sbatch, docker, srun: by name
    assert "-e PRIMUS_SECRET_PRIMUS_HF_TOKEN" in outputs[4]
    files = [p for p in workspace.rglob("*") if p.is_file()]
    assert any(p.name == "config.resolved.yaml" for p in files)
    leaked = [str(p) for p in files if FILE_LITERAL.encode() in p.read_bytes() or CLI_LITERAL.encode() in p.read_bytes()]
    assert not leaked
    run_dir = workspace / "amd" / "root" / "literal"
    assert "hf_token: ${PRIMUS_SECRET_PRE_TRAINER_PRIMUS_HF_TOKEN}" in (run_dir / "config.resolved.yaml").read_text()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert "primus.hf_token=<redacted>" in manifest["command"] and "primus.hf_token=<redacted>" in \
        manifest["attempts"][-1]["command"]
    received = {p.name: p.read_text() for p in probe.iterdir()}
    assert received == {f"rank{r}": hashlib.sha256(CLI_LITERAL.encode()).hexdigest() for r in (0, 1)}


def test_a_secret_handed_to_another_node_is_saved_by_reference(monkeypatch):
    """Slurm tasks and containers get ``primus.hf_token=${PRIMUS_SECRET_...}`` and the value by name;
    the node's own launcher then saves the reference, and its workers read the value back."""
    from primus.compat import AMD_PRIMUS
    from primus.config.resolve import resolve_experiment
    from primus.config.secrets import redact_argv, restore_secrets, secure_overrides
    from primus.runtime.registry import backend_defaults

    tokens, env = secure_overrides(["training.steps=2", "--primus.hf_token", CLI_LITERAL])
    assert tokens == ["training.steps=2", "--primus.hf_token", "${PRIMUS_SECRET_PRIMUS_HF_TOKEN}"]
    assert env == {"PRIMUS_SECRET_PRIMUS_HF_TOKEN": CLI_LITERAL}
    monkeypatch.setenv("PRIMUS_SECRET_PRIMUS_HF_TOKEN", CLI_LITERAL)
    tree, new_env = resolve_experiment(TINY_EXAMPLE, tokens, backend_defaults, dialect=AMD_PRIMUS).saved_tree()
    assert new_env == {}  # nothing literal left to hand on
    assert tree["modules"]["pre_trainer"]["params"]["primus"]["hf_token"] == "${PRIMUS_SECRET_PRIMUS_HF_TOKEN}"
    assert restore_secrets(tree)["modules"]["pre_trainer"]["params"]["primus"]["hf_token"] == CLI_LITERAL
    assert redact_argv(["primus", "train", "x.yaml", "--primus.hf_token", CLI_LITERAL, f"a.api_key={CLI_LITERAL}",
                        "primus.hf_token=${HF_TOKEN}"]) == [
        "primus", "train", "x.yaml", "--primus.hf_token", "<redacted>", "a.api_key=<redacted>",
        "primus.hf_token=${HF_TOKEN}"]


AMD_ENV_SECRETS = {"HF_TOKEN": "hf_PLANTEDamdENV0001", "WANDB_API_KEY": "PLANTEDamdENV0002",
                   "MY_DB_PASSWORD": "PLANTEDamdENV0003", "S3_SECRET": "PLANTEDamdENV0004"}


def _with_amd_environment_keys(tmp_path, text: str | None = None):
    """AMD's files put environment variables among a module's settings (``HF_TOKEN: hf_…``)."""
    lines = "".join(f"      {name}: {value}\n" for name, value in AMD_ENV_SECRETS.items())
    text = (TINY_EXAMPLE.read_text() if text is None else text).replace("    overrides:\n", "    overrides:\n" + lines)
    return write(tmp_path / "exp.yaml", text)


def test_an_environment_secret_among_a_modules_keys_is_never_printed_or_saved(tmp_path):
    """The "no effect: export it" line names the variable, never its value; neither does --why,
    the dry run, or the config the run would save."""
    from primus.config.resolve import resolve_experiment
    from primus.runtime.registry import backend_defaults, backend_derived
    from tests.helpers import cli_in_process

    exp = _with_amd_environment_keys(tmp_path)
    env = {"PRIMUS_WORKSPACE": str(tmp_path / "ws"), "PRIMUS_CACHE": str(tmp_path / "cache")}
    text = []
    for args in (["config", "validate", exp, "--no-engine"], ["config", "show", exp],
                 ["config", "show", exp, "--why", "HF_TOKEN"], ["train", exp, "--dry-run"]):
        result = cli_in_process(*args, env=env)
        assert result.returncode == 0, result.stderr
        text.append(result.stdout + result.stderr)
    assert "translated HF_TOKEN=<redacted> → no effect" in text[0]
    assert "translated MY_DB_PASSWORD=<redacted> → no effect" in text[0]
    tree, _ = resolve_experiment(exp, [], backend_defaults, backend_derived).saved_tree()
    import yaml

    text.append(yaml.safe_dump(tree))
    assert not [v for v in AMD_ENV_SECRETS.values() if v in "\n".join(text)]


@pytest.mark.e2e
def test_an_environment_secret_among_a_modules_keys_is_in_no_run_file(secret_run):
    workspace, result = secret_run
    assert "translated HF_TOKEN=<redacted>" in result.stdout + result.stderr
    files = [p for p in workspace.rglob("*") if p.is_file()]
    assert any(p.name == "info.log" for p in files)
    leaked = [str(p) for p in files for v in AMD_ENV_SECRETS.values() if v.encode() in p.read_bytes()]
    assert not leaked and not [v for v in AMD_ENV_SECRETS.values() if v in result.stdout + result.stderr]
