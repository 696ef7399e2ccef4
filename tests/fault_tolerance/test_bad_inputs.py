"""The bad-input corpus: every broken experiment, preset or command line exits 2 with ONE line
naming the file:line or dotted key (did-you-mean where it applies), no traceback, and writes
nothing into an existing run directory."""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
from pathlib import Path

import pytest

from primus.cli.main import main
from tests.conftest import ROOT

TT = ROOT / "examples" / "torchtitan" / "llama3_tiny-pretrain.yaml"
MG = ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml"
AM = ROOT / "examples" / "nemo_automodel" / "wan2_2_tiny-cpu.yaml"
GOOD = (TT.read_text()
        .replace("${PRIMUS_EXP_NAME:llama3_tiny-pretrain}", "precious"))

# (id, files to write into the case dir {name: text}, argv (EXP = the case's exp.yaml), expected fragment)
CASES = [
    # --- YAML and files -------------------------------------------------------------------
    ("yaml-unclosed", {"exp.yaml": "work_group: a\nmodules: [1, 2\n"}, ["config", "validate", "EXP"], "exp.yaml:3: invalid YAML"),
    ("yaml-duplicate-key", {"exp.yaml": GOOD + "exp_name: again\n"}, ["config", "validate", "EXP"], "duplicate key 'exp_name'"),
    ("yaml-not-mapping", {"exp.yaml": "- a\n- b\n"}, ["config", "validate", "EXP"], "exp.yaml:1: expected a mapping"),
    ("yaml-tab-indent", {"exp.yaml": "a:\n\tb: 1\n"}, ["config", "validate", "EXP"], "exp.yaml:2: invalid YAML"),
    ("missing-experiment", {}, ["train", "nope.yaml"], "nope.yaml: experiment file not found"),
    ("unknown-top-key", {"exp.yaml": GOOD.replace("exp_name:", "exp_nme:")}, ["config", "validate", "EXP"], "did you mean 'exp_name'?"),
    ("missing-workspace", {"exp.yaml": GOOD.replace("workspace:", "# workspace:")}, ["config", "validate", "EXP"], "missing required key 'workspace'"),
    ("unknown-module-key", {"exp.yaml": GOOD.replace("    config: pre", "    confg: pre")}, ["config", "validate", "EXP"], "did you mean 'config'?"),
    ("wrong-type-exp-name", {"exp.yaml": GOOD.replace("exp_name: precious", "exp_name: [a]")}, ["config", "validate", "EXP"], "exp_name=['a']"),
    ("exp-name-is-a-path", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "exp_name=../../x"], "exp_name='../../x'"),
    ("no-modules", {"exp.yaml": GOOD[:GOOD.index("modules:")] + "modules: {}\n"}, ["config", "validate", "EXP"], "modules={}"),
    ("unset-variable", {"exp.yaml": GOOD.replace("${PRIMUS_TEAM:amd}", "${PRIMUS_T_SURELY_UNSET}")}, ["config", "validate", "EXP"], "exp.yaml:2: environment variable PRIMUS_T_SURELY_UNSET is not set"),
    ("extends-cycle", {"exp.yaml": "extends: b.yaml\n", "b.yaml": "extends: exp.yaml\n"}, ["config", "validate", "EXP"], "extends cycle"),
    ("extends-missing", {"exp.yaml": "extends: base.yaml\n" + GOOD}, ["config", "validate", "EXP"], "extends 'base.yaml' not found"),
    ("preset-traversal", {"exp.yaml": GOOD.replace("model: llama3_tiny.yaml", "model: ../../../../etc/passwd")}, ["config", "validate", "EXP"], "escapes the preset folder"),
    ("preset-unknown", {"exp.yaml": GOOD.replace("model: llama3_tiny.yaml", "model: llama3_tinny.yaml")}, ["config", "validate", "EXP"], "did you mean 'llama3_tiny.yaml'?"),
    ("preset-user-path-missing", {"exp.yaml": GOOD.replace("model: llama3_tiny.yaml", "model: ./mine.yaml")}, ["config", "validate", "EXP"], "model preset file './mine.yaml' not found"),
    ("preset-bad-yaml", {"exp.yaml": GOOD.replace("model: llama3_tiny.yaml", "model: ./mine.yaml"), "mine.yaml": "model: {dim: [\n"}, ["config", "validate", "EXP"], "mine.yaml:2: invalid YAML"),
    ("preset-unknown-key", {"exp.yaml": GOOD.replace("model: llama3_tiny.yaml", "model: ./mine.yaml"), "mine.yaml": "model:\n  n_layers: 2\n  dim: 64\n  n_heads: 4\n  vocab_size: 512\n  rope_thetta: 1\n"}, ["config", "validate", "EXP"], "mine.yaml:6: unknown key 'modules.pre_trainer.model.rope_thetta' (did you mean 'rope_theta'?)"),
    ("unknown-framework", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "modules.pre_trainer.framework=torchtitn"], "did you mean 'torchtitan'?"),
    ("unsupported-stage", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "modules.pre_trainer.stage=posttrain"], "supported: pretrain"),
    ("bad-log-level", {"exp.yaml": GOOD + "logging: {level: VERBOSE}\n"}, ["config", "validate", "EXP"], "logging.level='VERBOSE'"),
    ("unknown-module-select", {"exp.yaml": GOOD}, ["train", "EXP", "--module", "post_trainer"], "--module post_trainer: no such module"),
    ("why-unknown-key", {"exp.yaml": GOOD}, ["config", "show", "EXP", "--why", "training.stepz"], "--why training.stepz: no such key"),
    # --- command-line overrides -------------------------------------------------------------
    ("override-no-equals", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "steps"], "'steps' is not an override"),
    ("override-bad-key", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "a..b=1"], "is not a dotted key"),
    ("override-bad-value", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "training.steps=[1"], "cannot parse the value"),
    ("override-unknown-module", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "modules.nope.training.steps=1"], "no module 'nope'"),
    # --- TorchTitan ------------------------------------------------------------------------
    ("tt-unknown-key", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "training.stepz=5"], "did you mean 'steps'?"),
    ("tt-unknown-section", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "traning.steps=5"], "did you mean 'training'?"),
    ("tt-wrong-type", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "training.steps=abc"], "'abc' is not a valid int"),
    ("tt-wrong-literal", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "lr_scheduler.decay_type=cubic"], "lr_scheduler.decay_type: 'cubic'"),
    ("tt-nested-unknown", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "--parallelism.tensor_parallel_degre", "2"], "did you mean 'tensor_parallel_degree'?"),
    ("tt-model-unknown", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "model.n_layer=2"], "did you mean 'n_layers'?"),
    ("tt-model-heads", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "model.dim=130"], "dim (130) must be divisible by n_heads (4)"),
    ("tt-attention", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "attn_backend=flx"], "did you mean 'flex'?"),
    ("tt-ac-mode", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "activation_checkpoint.mode=partial"], "'partial' is not one of"),
    ("tt-owned-key", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "dump_folder=/tmp"], "is set by Primus"),
    ("tt-optimizer-both", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "optimizer.param_groups=[]"], "not both"),
    ("tt-unknown-dataset", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "primus.tiny_assets=null", "dataloader.dataset=c5"], "unknown dataset 'c5'"),
    ("tt-missing-data-path", {"exp.yaml": GOOD}, ["train", "EXP", "primus.tiny_assets=null", "hf_assets_path=/nonexistent/tok"], "modules.pre_trainer.hf_assets_path: /nonexistent/tok/tokenizer.json does not exist"),
    ("tt-impossible-pp", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "parallelism.pipeline_parallel_degree=2", "parallelism.pipeline_parallel_microbatch_size=3"], "local_batch_size (4) must be evenly divisible"),
    # --- Megatron --------------------------------------------------------------------------
    ("mg-unknown-key", {"exp.yaml": "MG"}, ["config", "validate", "EXP", "num_layer=2"], "did you mean 'num_layers'?"),
    ("mg-wrong-type", {"exp.yaml": "MG"}, ["config", "validate", "EXP", "micro_batch_size=abc"], "micro_batch_size"),
    ("mg-heads-by-tp", {"exp.yaml": "MG"}, ["config", "validate", "EXP", "tensor_model_parallel_size=3"], "tensor_model_parallel_size"),
    ("mg-missing-data", {"exp.yaml": "MG"}, ["train", "EXP", "primus.tiny_assets=null", "mock_data=false", "tokenizer_type=HuggingFaceTokenizer", "tokenizer_model=/nonexistent/tok", "data_path=[/nonexistent/corpus]"], "modules.pre_trainer.tokenizer_model: /nonexistent/tok does not exist"),
    # --- NeMo AutoModel --------------------------------------------------------------------
    ("am-unknown-section", {"exp.yaml": "AM"}, ["config", "validate", "EXP", "step_schedular.max_steps=2"], "did you mean 'step_scheduler'?"),
    ("am-unsupported-stage", {"exp.yaml": "AM"}, ["config", "validate", "EXP", "modules.pre_trainer.stage=posttrain"], "supported: pretrain, finetune"),
    ("am-unknown-kwarg", {"exp.yaml": "AM"}, ["config", "validate", "EXP", "optimizer.lrr=0.1"], "did you mean 'lr'?"),
    # --- environment -----------------------------------------------------------------------
    ("backend-not-installed", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "NOT_INSTALLED"], "run `primus prepare torchtitan`"),
    ("workspace-not-writable", {"exp.yaml": GOOD, "afile": "x"}, ["train", "EXP", "workspace=CASE/afile/ws"], "cannot write run directory"),
]


def _snapshot(path: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(path.rglob("*")):
        digest.update(str(file.relative_to(path)).encode())
        if file.is_file():
            digest.update(file.read_bytes())
            digest.update(str(file.stat().st_mtime_ns).encode())
    return digest.hexdigest()


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 40


@pytest.mark.parametrize("case_id, files, argv, fragment", CASES, ids=[c[0] for c in CASES])
def test_bad_input(case_id, files, argv, fragment, tmp_path, monkeypatch, capsys):
    workspace = tmp_path / "ws"
    precious = workspace / "amd" / "root" / "precious"
    (precious / "checkpoints" / "step-2").mkdir(parents=True)
    (precious / "manifest.json").write_text(json.dumps({"status": "failed", "start_time": "earlier"}))
    (precious / "metrics.jsonl").write_text('{"step": 1, "loss": 3.0}\n')
    before = _snapshot(workspace)
    for name, text in files.items():
        text = {"MG": MG.read_text(), "AM": AM.read_text()}.get(text, text)
        (tmp_path / name).write_text(text.replace("${PRIMUS_EXP_NAME:", "${PRIMUS_T_EXP_NAME:precious}${UNUSED:")
                                     if text in (MG.read_text(), AM.read_text()) else text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRIMUS_WORKSPACE", str(workspace))
    monkeypatch.setenv("PRIMUS_CACHE", str(tmp_path / "cache"))
    argv = [a.replace("EXP", str(tmp_path / "exp.yaml")).replace("CASE", str(tmp_path)) for a in argv]
    if "NOT_INSTALLED" in argv:
        argv.remove("NOT_INSTALLED")
        real_version = importlib.metadata.version

        def version(name):
            if name == "torchtitan":
                raise importlib.metadata.PackageNotFoundError(name)
            return real_version(name)

        monkeypatch.setattr(importlib.metadata, "version", version)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("primus: error: ") and "Traceback" not in err
    assert fragment in lines[0], lines[0]
    assert _snapshot(workspace) == before  # nothing written into any existing run directory
    assert sorted(p.name for p in (workspace / "amd" / "root").iterdir()) == ["precious"]
    assert not (tmp_path / "cache").exists() or case_id.startswith(("mg-", "am-"))
