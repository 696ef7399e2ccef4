"""Shared caches and outputs take a lock: two processes building one fresh ``primus.tiny_assets``
cache both end with the whole cache (the second waits); a lock held by a live process is never
taken twice, and a lock left by a killed one is taken at once. (Two exports into one OUT_DIR:
``test_export_faults.py``.)"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest

from primus.runtime.locks import Busy, exclusive


def _build(root: str, start, results) -> None:
    from primus.data.sft_tiny import write_instruction_files
    from primus.data.tiny_assets import ensure_tiny_assets

    start.wait()
    try:
        paths = ensure_tiny_assets(root, n_docs=3000)
        write_instruction_files(os.path.join(root, "sft"))
        results.put(("ok", os.getpid(), str(paths["corpus_file"])))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        results.put(("failed", os.getpid(), f"{type(exc).__name__}: {exc}"))


def test_two_processes_building_one_fresh_cache_both_get_it_whole(tmp_path):
    context = multiprocessing.get_context("spawn")
    start, results = context.Event(), context.Queue()
    workers = [context.Process(target=_build, args=(str(tmp_path / "cache"), start, results)) for _ in range(2)]
    for worker in workers:
        worker.start()
    start.set()
    outcomes = [results.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    assert [o[0] for o in outcomes] == ["ok", "ok"], outcomes
    corpus = tmp_path / "cache" / "corpus" / "data.jsonl"
    lines = corpus.read_text().splitlines()
    assert len(lines) == 3000 and all(json.loads(line)["text"] for line in lines)
    assert json.loads((tmp_path / "cache" / "tokenizer" / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    assert len((tmp_path / "cache" / "sft" / "messages.jsonl").read_text().splitlines()) == 800
    leftovers = [p.name for p in tmp_path.rglob("*") if p.suffix in (".tmp", ".lock")]
    assert leftovers == []


@pytest.mark.e2e
def test_a_held_lock_is_refused_or_waited_for(tmp_path):
    lock = tmp_path / "out.lock"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from primus.runtime.locks import exclusive\n"
        f"with exclusive({str(lock)!r}, what='x'):\n"
        "    print('held', flush=True); time.sleep(60)")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(Busy, match=f"x: pid {holder.pid} is writing it right now"):
            with exclusive(lock, what="x"):
                pass
        started = time.monotonic()
        with pytest.raises(Busy):
            with exclusive(lock, what="x", wait_s=1.0):
                pass
        assert time.monotonic() - started >= 1.0
        holder.send_signal(signal.SIGKILL)  # the kernel drops a killed holder's lock
        holder.wait(timeout=30)
        with exclusive(lock, what="x", wait_s=5.0):
            assert lock.read_text() == f"pid {os.getpid()}"
        assert not lock.exists()
    finally:
        holder.kill()
        holder.wait()
