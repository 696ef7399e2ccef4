"""``dataloader.blend``: a weighted blend of datasets on TorchTitan's loader. What a rank draws is
measured by where each sequence came from (each dataset's own packed stream), over the first N
sequences: within 2% of the weights; the position resumes mid-blend; a run logs the blend and the
sequences each dataset gives; a bad blend is refused in one line."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import TINY_EXAMPLE
from tests.helpers import cli_in_process, read_metrics, train_with_torchrun

pytest.importorskip("torchtitan")

WEIGHTS = [0.2, 0.3, 0.5]
N, SEQ_LEN = 200, 32


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """The tiny corpus dealt into three JSONL folders (no document in two of them), and its tokenizer."""
    from primus.data.tiny_assets import ensure_tiny_assets

    root = tmp_path_factory.mktemp("blend")
    assets = ensure_tiny_assets(root / "tiny")
    lines = assets["corpus_file"].read_text().splitlines()
    folders = []
    for k, name in enumerate("abc"):
        folder = root / name
        folder.mkdir()
        (folder / "data.jsonl").write_text("\n".join(lines[k::3]) + "\n")
        folders.append(str(folder))
    return folders, assets


def _loader(corpora, blend=None, path=None, dp=1, rank=0):
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from primus.backends.torchtitan.recipes.pretrain import register_local_datasets
    from primus.backends.torchtitan.data import PrimusTextDataLoader

    folders, assets = corpora
    register_local_datasets()
    config = PrimusTextDataLoader.Config(dataset="jsonl", dataset_path=path, blend=blend or [], infinite=True)
    return PrimusTextDataLoader(config, dp_world_size=dp, dp_rank=rank, seq_len=SEQ_LEN, local_batch_size=4,
                                tokenizer=HuggingFaceTokenizer(tokenizer_path=str(assets["tokenizer"])))


def _sequences(loader, n):
    out = []
    for batch, _labels in loader:
        out += [row.numpy().tobytes() for row in batch["input"]]
        if len(out) >= n:
            return out[:n]
    return out


def _blend(folders):
    return [x for w, f in zip(WEIGHTS, folders) for x in (w, f)]


@pytest.mark.parametrize("dp", [1, 2])
def test_the_first_sequences_hold_the_weights(corpora, dp):
    folders, _ = corpora
    drawn = [s for rank in range(dp) for s in _sequences(_loader(corpora, _blend(folders), dp=dp, rank=rank), N // dp)]
    sources = [set(_sequences(_loader(corpora, path=f, dp=dp, rank=rank), N)) for f in folders for rank in range(dp)]
    origin = [[i // dp for i, source in enumerate(sources) if s in source] for s in drawn]
    assert all(len(o) == 1 for o in origin)  # each sequence is one dataset's own
    shares = [sum(o == [k] for o in origin) / len(drawn) for k in range(3)]
    assert shares == pytest.approx(WEIGHTS, abs=0.02), shares


def test_a_resumed_blend_continues_where_it_stopped(corpora):
    folders, _ = corpora
    straight = _sequences(_loader(corpora, _blend(folders)), 40)
    first = _loader(corpora, _blend(folders))
    batches = iter(first)
    for _ in range(5):  # 20 sequences
        next(batches)
    resumed = _loader(corpora, _blend(folders))
    resumed.load_state_dict(first.state_dict())
    assert _sequences(resumed, 20) == straight[20:]


@pytest.mark.e2e
def test_a_blended_run_logs_what_each_dataset_gives(corpora, tmp_path):
    folders, assets = corpora
    params = {"primus": {"tiny_assets": str(Path(assets["tokenizer"]).parent)}, "dataloader": {"blend": _blend(folders)},
              "training": {"steps": 2, "local_batch_size": 50, "seq_len": SEQ_LEN}, "debug": {"seed": 42}, "optimizer": {"lr": 1e-3},
              "model": {"n_layers": 1, "dim": 64, "n_heads": 2, "n_kv_heads": 2, "multiple_of": 32, "vocab_size": 512,
                        "max_seq_len": 64}}
    result = train_with_torchrun(tmp_path / "run", "torchtitan", params, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2]
    log = (tmp_path / "run" / "output.log").read_text()
    line = next(line for line in log.splitlines() if "data blend (train, 100 samples)" in line)
    for weight, folder, count in zip(WEIGHTS, folders, (20, 30, 50)):
        assert f"{folder} weight {weight}: {count} samples" in line, line


def test_a_bad_blend_is_refused_in_one_line(tmp_path):
    workspace = tmp_path / "ws"
    for override, reason in [("dataloader.blend=[0.5, a, 0.5]", "weights and paths must alternate"),
                             ("dataloader.blend=[0.5, a, 0.5, b]", "blend[1]: a does not exist"),
                             ("dataloader.reshardable=true", "does not combine with dataloader.reshardable")]:
        extra = ["dataloader.blend=[0.5, a, 0.5, b]"] if "blend" not in override else []
        result = cli_in_process("train", TINY_EXAMPLE, override, *extra,
                                env={**os.environ, "PRIMUS_WORKSPACE": str(workspace)})
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
        assert lines[0].startswith("primus: error: ") and "modules.pre_trainer.dataloader.blend" in lines[0] \
            and reason in lines[0], lines[0]
    assert not workspace.exists()
