"""Bad input is one line, exit 2, nothing written.

The bad-input corpus: every broken experiment, preset, command line, environment value or run
directory exits 2 with ONE line naming the file:line or dotted key (did-you-mean where it
applies), no traceback, never echoing a secret, and writes nothing into an existing run directory."""
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
PLANTED = "hf_PLANTEDsecret9876"  # no error line may ever show it
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(  # 9**10 leaves once expanded
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(9))
MERGE_BOMB = "m0: &m0 {" + ", ".join(f"k{i}: 1" for i in range(10)) + "}\n" + "".join(
    f"m{i + 1}: &m{i + 1} {{<<: [{', '.join([f'*m{i}'] * 10)}]}}\n" for i in range(8))
DEEP_BLOCK = GOOD + "".join("  " * i + f"k{i}:\n" for i in range(400)) + "  " * 400 + "leaf: 1\n"
HUGE = "9" * 5000
END = GOOD.count("\n") + 1  # the line of text appended to GOOD
STEPS = next(i for i, line in enumerate(GOOD.splitlines(), 1) if "steps: 20" in line)
DEBUG = next(i for i, line in enumerate(GOOD.splitlines(), 1) if "debug: {seed: 42}" in line)

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
    ("tt-impossible-pp", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "parallelism.pipeline_parallel_degree=2", "parallelism.pipeline_parallel_microbatch_size=3"], "pipeline_parallel_microbatch_size: 3 does not divide training.local_batch_size (4)"),
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
    # --- hostile YAML: one line, bounded time and memory --------------------------------------
    ("yaml-alias-bomb", {"exp.yaml": GOOD + BOMB}, ["config", "validate", "EXP"], "an alias bomb?"),
    ("yaml-merge-key-bomb", {"exp.yaml": GOOD + MERGE_BOMB}, ["config", "validate", "EXP"], "merge keys (<<) expand to more than"),
    ("yaml-deep-block", {"exp.yaml": DEEP_BLOCK}, ["config", "validate", "EXP"], "nested more than 64 levels deep"),
    ("yaml-deep-flow", {"exp.yaml": GOOD + "x: " + "[" * 3000 + "]" * 3000 + "\n"}, ["config", "validate", "EXP"], "nested more than 64 levels deep"),
    ("yaml-latin1-in-comment", {"exp.yaml": (GOOD + "# caf\xe9\n").encode("latin-1")}, ["config", "validate", "EXP"], f"exp.yaml:{END}: not UTF-8 text (byte 0xe9)"),
    ("yaml-utf16", {"exp.yaml": GOOD.encode("utf-16")}, ["config", "validate", "EXP"], "exp.yaml: the file is UTF-16 text; save it as UTF-8"),
    ("yaml-control-byte", {"exp.yaml": GOOD.replace("debug: {seed: 42}", "debug: {seed: 42\x07}")}, ["config", "validate", "EXP"], f"exp.yaml:{DEBUG}: invalid YAML: unacceptable character #x0007"),
    ("yaml-nul-in-comment", {"exp.yaml": GOOD + "# \x00\n"}, ["config", "validate", "EXP"], f"exp.yaml:{END}: invalid YAML: unacceptable character #x0000"),
    ("yaml-huge-int", {"exp.yaml": GOOD.replace("steps: 20", f"steps: {HUGE}")}, ["config", "validate", "EXP"], "exp.yaml: an integer of thousands of digits is out of range"),
    ("yaml-int-beyond-64-bit", {"exp.yaml": GOOD.replace("steps: 20", "steps: " + "9" * 30)}, ["config", "validate", "EXP"], f"exp.yaml:{STEPS}: an integer of 30 digits is out of range"),
    ("yaml-not-plain-data", {"exp.yaml": GOOD + "extra: !!binary aGVsbG8=\n"}, ["config", "validate", "EXP"], "the YAML tag tag:yaml.org,2002:binary is not plain data"),
    ("yaml-list-as-key", {"exp.yaml": GOOD + "? [a, b]\n: 1\n"}, ["config", "validate", "EXP"], "keys must be strings, got a list"),
    ("yaml-long-key", {"exp.yaml": GOOD + "k" * 300 + ": 1\n"}, ["config", "validate", "EXP"], f"exp.yaml:{END}: a key of 300 characters is too long"),
    ("env-huge-int", {"exp.yaml": GOOD.replace("steps: 20", "steps: '${PRIMUS_T_HUGE}'")}, ["config", "validate", "EXP", f"ENV:PRIMUS_T_HUGE={HUGE}"], f"exp.yaml:{STEPS}: an integer of thousands of digits is out of range"),
    ("env-int-beyond-64-bit", {"exp.yaml": GOOD.replace("steps: 20", "steps: '${PRIMUS_T_HUGE}'")}, ["config", "validate", "EXP", "ENV:PRIMUS_T_HUGE=" + "9" * 25], f"exp.yaml:{STEPS}: an integer of 25 digits is out of range"),
    ("override-huge-int", {"exp.yaml": GOOD}, ["config", "validate", "EXP", f"training.steps={HUGE}"], "an integer of thousands of digits is out of range"),
    ("override-int-beyond-64-bit", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "training.steps=" + "9" * 20], "an integer of 20 digits is out of range"),
    ("override-deep-value", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "training.steps=" + "[" * 2000 + "]" * 2000], "nested more than 64 levels deep"),
    ("override-long-dotted-key", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "a." * 200 + "b=1"], "is too long (401 characters, 201 segments"),
    ("experiment-is-a-directory", {"adir/x.yaml": GOOD}, ["train", "CASE/adir"], "adir: is a directory, not an experiment file"),
    # --- names that would leave the workspace ----------------------------------------------------
    ("exp-name-dotdot", {"exp.yaml": GOOD}, ["train", "EXP", "exp_name=.."], "exp_name='..': must be one directory name"),
    ("exp-name-dot", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "exp_name=."], "exp_name='.': must be one directory name"),
    ("work-group-dotdot", {"exp.yaml": GOOD.replace("${PRIMUS_TEAM:amd}", "..")}, ["train", "EXP"], "exp.yaml:2: work_group='..'"),
    ("user-name-dotdot-from-env", {"exp.yaml": GOOD}, ["train", "EXP", "ENV:PRIMUS_USER=.."], "exp.yaml:3: user_name='..'"),
    ("workspace-unterminated-reference", {"exp.yaml": GOOD.replace("${PRIMUS_WORKSPACE:./output}", "${PRIMUS_T_WS:./output")}, ["train", "EXP"], "exp.yaml:5: '${PRIMUS_T_WS:./output' has no closing '}'"),
    ("workspace-bad-reference", {"exp.yaml": GOOD.replace("${PRIMUS_WORKSPACE:./output}", "${1WS}/x")}, ["train", "EXP"], "exp.yaml:5: '${1WS}' is not ${VAR} or ${VAR:default}"),
    # --- values outside their range (the Primus schema) -----------------------------------------
    ("primus-peak-zero", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "primus.peak_tflops=0"], "primus.peak_tflops=0: Input should be greater than 0"),
    ("primus-peak-nan", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "primus.peak_tflops=.nan"], "Input should be a finite number"),
    ("primus-peak-inf", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "primus.peak_tflops=.inf"], "Input should be a finite number"),
    ("primus-peak-huge", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "primus.peak_tflops=1e9"], "less than or equal to 1000000"),
    ("negative-console-rank", {"exp.yaml": GOOD}, ["config", "validate", "EXP", "logging.console_ranks=[-1]"], "logging.console_ranks.0=-1: Input should be greater than or equal to 0"),
    ("resume-validates-first", {"exp.yaml": GOOD, "precious/manifest.json": '{"status": "completed", "start_time": "earlier"}'}, ["train", "EXP", "--resume", "primus.peak_tflops=-1"], "primus.peak_tflops=-1"),
    # --- secrets are never echoed --------------------------------------------------------------
    ("secret-wrong-type-not-echoed", {"exp.yaml": GOOD}, ["config", "validate", "EXP", f"primus.hf_token=[{PLANTED}]"], "primus.hf_token=<redacted>: Input should be a valid string"),
    ("secret-in-file-not-echoed", {"exp.yaml": GOOD.replace("      training:", f"        hf_token: {{a: {PLANTED}}}\n      training:")}, ["config", "validate", "EXP"], f"exp.yaml:{STEPS}: modules.pre_trainer.primus.hf_token=<redacted>"),
    ("secret-bad-yaml-not-echoed", {"exp.yaml": GOOD}, ["config", "validate", "EXP", f"primus.hf_token=[{PLANTED}"], "cannot parse the value in 'primus.hf_token=<redacted>'"),
    # --- the run directory ---------------------------------------------------------------------
    ("manifest-truncated", {"exp.yaml": GOOD, "precious/manifest.json": '{"status": "compl'}, ["train", "EXP"], "manifest.json: damaged (JSONDecodeError"),
    ("checkpoint-all-damaged", {"exp.yaml": GOOD, "precious/checkpoints/step-3/.metadata": b"\x80\x04 not a pickle"}, ["train", "EXP"], "no usable checkpoint to resume from; the newest: " ),
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
    assert len(CASES) >= 85


@pytest.mark.parametrize("case_id, files, argv, fragment", CASES, ids=[c[0] for c in CASES])
def test_bad_input(case_id, files, argv, fragment, tmp_path, monkeypatch, capsys):
    workspace = tmp_path / "ws"
    precious = workspace / "amd" / "root" / "precious"
    (precious / "checkpoints" / "step-2").mkdir(parents=True)
    (precious / "manifest.json").write_text(json.dumps({"status": "failed", "start_time": "earlier"}))
    (precious / "metrics.jsonl").write_text('{"step": 1, "loss": 3.0}\n')
    for name, text in files.items():  # a damaged run directory is part of some cases
        if name.startswith("precious/"):
            target = precious / name.removeprefix("precious/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(text if isinstance(text, bytes) else text.encode())
    before = _snapshot(workspace)
    for name, text in files.items():
        if name.startswith("precious/"):
            continue
        text = {"MG": MG.read_text(), "AM": AM.read_text()}.get(text, text)
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            (tmp_path / name).write_bytes(text)
            continue
        (tmp_path / name).write_text(text.replace("${PRIMUS_EXP_NAME:", "${PRIMUS_T_EXP_NAME:precious}${UNUSED:")
                                     if text in (MG.read_text(), AM.read_text()) else text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRIMUS_WORKSPACE", str(workspace))
    monkeypatch.setenv("PRIMUS_CACHE", str(tmp_path / "cache"))
    for item in [a for a in argv if a.startswith("ENV:")]:
        name, _, value = item.removeprefix("ENV:").partition("=")
        monkeypatch.setenv(name, value)
    argv = [a.replace("EXP", str(tmp_path / "exp.yaml")).replace("CASE", str(tmp_path)) for a in argv
            if not a.startswith("ENV:")]
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
    assert PLANTED not in err and "PLANTED" not in lines[0]
    assert _snapshot(workspace) == before  # nothing written into any existing run directory
    assert sorted(p.name for p in (workspace / "amd" / "root").iterdir()) == ["precious"]
    assert not (tmp_path / "cache").exists() or case_id.startswith(("mg-", "am-"))
