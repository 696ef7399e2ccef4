"""Planted secrets never appear in logs, configs, manifests, dry-run output or preflight reports."""
import pytest

from tests.conftest import TINY_EXAMPLE, write

SECRETS = {"HF_TOKEN": "hf_PLANTEDsecret0001", "WANDB_API_KEY": "PLANTEDsecret0002",
           "PRIMUS_T_SECRET": "PLANTEDsecret0003", "DB_PASSWORD": "PLANTEDsecret0004"}


def _leaks(text: str) -> list[str]:
    return [value for value in SECRETS.values() if value in text]


@pytest.mark.e2e
def test_no_planted_secret_in_any_output(run_primus, workspace, tmp_path):
    exp = write(tmp_path / "exp.yaml", TINY_EXAMPLE.read_text().replace(
        "        tiny_assets:", '        hf_token: "${HF_TOKEN}"\n        tiny_assets:'))
    outputs = []
    for args in (["config", "show", exp], ["train", exp, "--dry-run"],
                 ["train", exp, "exp_name=secrets", "training.steps=2"],
                 ["preflight", "--quick", "--tests", "gemm", "--report-dir", tmp_path / "preflight"]):
        result = run_primus(*args, env=SECRETS)
        assert result.returncode == 0, result.stderr[-2000:]
        outputs += [result.stdout, result.stderr]
    assert not _leaks("\n".join(outputs))
    files = [p for root in (workspace, tmp_path / "preflight") for p in root.rglob("*") if p.is_file()]
    assert any(p.name == "config.resolved.yaml" for p in files) and any(p.name.endswith(".pdf") for p in files)
    leaked = {str(p): _leaks(p.read_bytes().decode("utf-8", "replace")) for p in files}
    assert not {k: v for k, v in leaked.items() if v}
    resolved = next(p for p in files if p.name == "config.resolved.yaml").read_text()
    assert "hf_token: ${HF_TOKEN}" in resolved  # saved as the reference, re-read by workers
