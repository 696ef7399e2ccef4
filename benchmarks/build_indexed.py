"""`primus data build-indexed` vs Megatron-LM's own ``tools/preprocess_data.py``, same input, one run.

Megatron-LM's script is not in the megatron-core wheel: it is taken from a Megatron-LM checkout
(``--megatron-lm DIR``, a snapshot at tag ``core_v0.16.1``, the installed megatron-core's release),
copied into a temp dir and run there unmodified, with two stand-ins it needs on a CPU box: ``six``
(its BERT tokenizer imports it; installed into the temp dir, never into the venv) and an empty
``megatron.core.transformer.custom_layers.batch_invariant_kernels`` (``megatron.training`` imports
those Triton kernels at import time; the tokenizing path never calls them).

Input: a JSON Lines corpus of real text (the ``.py``/``.md``/``.txt`` files of this venv, cut into
documents, sorted, so the same every run) and a 32k byte-level BPE trained on it (no hub). Both
tools get the same workers; each run is timed end to end (start-up included), ABBA interleaved.
Reported: tokens/s and tokens/s per worker process for each, their ratio (target >= 1.0), and
whether the two ``.bin`` files hold the same tokens.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import PRIMUS, PY, REPO, machine, md_table, median, save

TAG = "core_v0.16.1"
EOS = "<|end_of_text|>"


def make_corpus(path: Path, megabytes: float) -> int:
    """Documents from the text files of this venv (sorted: the same corpus every run)."""
    site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    budget, written = int(megabytes * 1e6), 0
    with path.open("w", encoding="utf-8") as out:
        for file in sorted(site.rglob("*")):
            if written >= budget:
                break
            if file.suffix not in (".py", ".md", ".txt", ".rst") or not file.is_file():
                continue
            try:
                text = file.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            for start in range(0, len(text), 20000):  # documents of up to ~20 kB
                doc = text[start:start + 20000]
                if doc.strip():
                    line = json.dumps({"text": doc}) + "\n"
                    out.write(line)
                    written += len(line.encode())
    return written


def make_tokenizer(corpus: Path, out_dir: Path, vocab_size: int = 32000) -> Path:
    """A byte-level BPE trained on (the first 20 MB of) the corpus; tokenizer.json + tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def texts():
        seen = 0
        with corpus.open(encoding="utf-8") as lines:
            for line in lines:
                seen += len(line)
                if seen > 20e6:
                    return
                yield json.loads(line)["text"]

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts(), trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": EOS, "tokenizer_class": "PreTrainedTokenizerFast"}))
    return out_dir


def megatron_tools(checkout: Path, into: Path) -> Path:
    """Megatron-LM's ``megatron/`` and ``tools/`` at TAG in ``into``, with the stand-ins it needs here."""
    into.mkdir(parents=True, exist_ok=True)
    if (checkout / ".git").exists() or (checkout / "HEAD").exists():
        archive = subprocess.run(["git", f"--git-dir={checkout / '.git' if (checkout / '.git').exists() else checkout}",
                                  "archive", TAG, "megatron", "tools"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    else:
        for part in ("megatron", "tools"):
            shutil.copytree(checkout / part, into / part, dirs_exist_ok=True)
    stubs = into / "stubs"
    stubs.mkdir()
    (stubs / "sitecustomize.py").write_text(
        "import sys, types\n"
        "_m = types.ModuleType('megatron.core.transformer.custom_layers.batch_invariant_kernels')\n"
        "_m.enable_batch_invariant_mode = None\n"
        "sys.modules[_m.__name__] = _m\n")
    subprocess.run([PY, "-m", "pip", "install", "-q", "--target", str(into / "deps"), "six"], check=True)
    return into


def _megatron_cmd(root: Path, corpus: Path, tokenizer: Path, prefix: Path, workers: int) -> list[str]:
    return [PY, "-W", "ignore", str(root / "tools" / "preprocess_data.py"), "--input", str(corpus),
            "--output-prefix", str(prefix), "--tokenizer-type", "HuggingFaceTokenizer",
            "--tokenizer-model", str(tokenizer), "--workers", str(workers), "--append-eod",
            "--log-interval", "1000000"]


def _primus_cmd(corpus: Path, tokenizer: Path, prefix: Path, workers: int) -> list[str]:
    return [PRIMUS, "data", "build-indexed", str(corpus), "--tokenizer", str(tokenizer),
            "--output-prefix", str(prefix), "--workers", str(workers)]


def _timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed: {proc.stderr[-2000:]}")
    return time.perf_counter() - start


def _tokens(prefix: Path) -> Any:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    return IndexedDataset(str(prefix))


def run(megatron_lm: Path, megabytes: float = 20.0, workers: tuple[int, ...] = (1, 2), reps: int = 2) -> dict[str, Any]:
    import numpy

    with tempfile.TemporaryDirectory(prefix="bench-build-indexed-") as tmp:
        tmp = Path(tmp)
        corpus = tmp / "corpus.jsonl"
        corpus_bytes = make_corpus(corpus, megabytes)
        tokenizer = make_tokenizer(corpus, tmp / "tokenizer")
        root = megatron_tools(megatron_lm, tmp / "mlm")
        env_megatron = {**os.environ, "PYTHONPATH": f"{root / 'stubs'}:{root}:{root / 'deps'}"}
        env_primus = {**os.environ, "TQDM_DISABLE": "1"}
        rows = []
        for n in workers:
            times: dict[str, list[float]] = {"primus": [], "megatron": []}
            for rep in range(reps):  # ABBA: A B, then B A
                order = ("primus", "megatron") if rep % 2 == 0 else ("megatron", "primus")
                for name in order:
                    prefix = tmp / f"{name}-{n}"
                    cmd = (_primus_cmd(corpus, tokenizer, prefix, n) if name == "primus"
                           else _megatron_cmd(root, corpus, tokenizer, prefix, n))
                    times[name].append(_timed(cmd, env_primus if name == "primus" else env_megatron))
            ours, theirs = _tokens(tmp / f"primus-{n}"), _tokens(tmp / f"megatron-{n}_text_document")
            tokens = int(ours.sequence_lengths.sum())
            same = (len(ours) == len(theirs) and numpy.array_equal(ours.sequence_lengths, theirs.sequence_lengths)
                    and all(numpy.array_equal(ours[i], theirs[i]) for i in range(len(ours))))
            t_ours, t_theirs = median(times["primus"]), median(times["megatron"])
            rows.append({"workers": n, "tokens": tokens, "documents": len(ours), "same_tokens": same,
                         "primus_s": times["primus"], "megatron_s": times["megatron"],
                         "primus_tokens_per_s_per_worker": tokens / t_ours / n,
                         "megatron_tokens_per_s_per_worker": int(theirs.sequence_lengths.sum()) / t_theirs / n,
                         "ratio": t_theirs / t_ours})
    result = {"machine": machine(), "megatron_lm": TAG, "corpus_bytes": corpus_bytes, "vocab": 32000,
              "reps": reps, "rows": rows, "target": ">= 1.0x Megatron-LM's preprocess_data.py tokens/s per core",
              "met": all(r["ratio"] >= 1.0 for r in rows)}
    save("build_indexed", result)
    return result


def markdown(result: dict[str, Any]) -> str:
    return md_table(
        ["workers", "tokens", "primus tok/s/worker", "preprocess_data.py tok/s/worker", "ratio", "same tokens"],
        [[r["workers"], r["tokens"], f"{r['primus_tokens_per_s_per_worker']:,.0f}",
          f"{r['megatron_tokens_per_s_per_worker']:,.0f}", f"{r['ratio']:.2f}x", r["same_tokens"]]
         for r in result["rows"]])


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megatron-lm", type=Path, required=True,
                        help=f"a Megatron-LM git checkout or bare mirror holding tag {TAG}")
    parser.add_argument("--megabytes", type=float, default=20.0)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args(argv)
    result = run(args.megatron_lm, args.megabytes, tuple(int(w) for w in args.workers.split(",")), args.reps)
    print(markdown(result))
    print(json.dumps({k: result[k] for k in ("corpus_bytes", "met")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
