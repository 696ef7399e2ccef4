"""Shared fixtures: run the real `primus` CLI in a subprocess, in a private workspace."""
from __future__ import annotations

import collections
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from tests.helpers import CLI, WarmServer, run_cli

ROOT = Path(__file__).resolve().parent.parent
PRIMUS = CLI
TINY_EXAMPLE = ROOT / "examples" / "torchtitan" / "llama3_tiny-pretrain.yaml"
# The seed PR's [TRAIN] line, its fields in its order: parsers written for it must keep working.
SEED_TRAIN_LINE = re.compile(r"\[TRAIN\] step=(\d+) loss=(\S+) step_time=([\d.]+)s samples_per_sec=([\d.]+) "
                             r"samples_per_sec_per_gpu=([\d.]+) mem=([\d.]+)GB\b")


def assert_seed_train_lines(stdout: str, steps: list[int]) -> None:
    """Every [TRAIN] line of a run's console matches the seed's regex, one per step, in order."""
    lines = [line for line in stdout.splitlines() if "[TRAIN]" in line]
    parsed = [SEED_TRAIN_LINE.search(line) for line in lines]
    assert all(parsed), [line for line, m in zip(lines, parsed) if not m][:3]
    assert [int(m.group(1)) for m in parsed] == steps


# Seconds each test file took in a full run (`python3 dev.py test --record-durations` rewrites it): only the
# order files are handed to the pytest workers follows it, nothing is timed against it.
DURATIONS = Path(__file__).with_name("durations.json")
SECONDS_PER_ENGINE_RUN = 10.0  # the guess for a file not in DURATIONS yet, per test that starts a process


def pytest_addoption(parser):
    parser.addoption("--record-durations", action="store_true",
                     help=f"write each test file's seconds in this run to {DURATIONS.relative_to(ROOT)}")


def pytest_collection_modifyitems(config, items):
    """The longest files first (each file's own order kept): the two workers (`--dist loadfile`, one file at
    a time) then end together on short files, instead of one of them running a long file alone at the end."""
    known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    runs = collections.Counter(item.path for item in items if item.get_closest_marker("e2e"))

    def expected(path: Path) -> float:
        return known.get(str(path.relative_to(ROOT)), SECONDS_PER_ENGINE_RUN * runs[path])

    first_seen = {path: i for i, path in enumerate(dict.fromkeys(item.path for item in items))}
    items.sort(key=lambda item: (-expected(item.path), first_seen[item.path]))


_file_seconds: collections.Counter = collections.Counter()


def pytest_runtest_logreport(report):
    _file_seconds[report.nodeid.split("::")[0]] += report.duration  # setup, call and teardown


def pytest_sessionfinish(session):
    """``--record-durations``, in the process that saw every report (xdist's controller, or the only one)."""
    if session.config.getoption("record_durations") and not hasattr(session.config, "workerinput"):
        DURATIONS.write_text(json.dumps({path: round(seconds, 1) for path, seconds in sorted(_file_seconds.items())},
                                        indent=0) + "\n")


# What a unit test may not start: another Python (the primus CLI, an engine, a tools/ script) or a shell
# that would start one. Those tests carry the e2e marker, so `-m "not e2e"` is the fast in-process subset.
_STARTS_PYTHON = re.compile(r"^(python[\d.]*|primus|torchrun|bash|sh|srun|sbatch)$")


@pytest.fixture(autouse=True)
def _unit_tests_start_no_python(request, monkeypatch):
    """Fail a test without the e2e marker at the moment it starts a Python process."""
    if request.node.get_closest_marker("e2e"):
        return
    original = subprocess.Popen.__init__

    def guarded(self, args, *rest, **kwargs):
        argv = os.fsdecode(args).split() if isinstance(args, (str, bytes, os.PathLike)) else list(map(str, args))
        # any word, not just the first: `timeout 120 python ...`, `env X=1 primus ...`
        program = next((Path(word).name for word in argv if _STARTS_PYTHON.match(Path(word).name)), None)
        if program:
            pytest.fail(f"a unit test started {program} ({' '.join(argv)[:120]}): mark it e2e", pytrace=False)
        original(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)
    # a warm run forks from a server started earlier: no Popen to catch, so refuse it here
    monkeypatch.setattr(WarmServer, "run", lambda self, args, *rest, **kwargs: pytest.fail(
        f"a unit test ran primus {' '.join(args)[:120]} (warm): mark it e2e", pytrace=False))


# Tests never write the user's caches: the local device profile and the CPU peaks that preflight and the
# plan tests measure go to a folder of this session (a profile measured under the suite's load, left in
# ~/.cache, would be what every later real run on this host is projected with).
_SESSION_CACHES = tempfile.mkdtemp(prefix="primus-test-caches-")
os.environ.setdefault("PRIMUS_PROFILE_CACHE", os.path.join(_SESSION_CACHES, "profiles"))
os.environ.setdefault("PRIMUS_PEAK_CACHE", os.path.join(_SESSION_CACHES, "cpu_peaks.json"))

# Torch's Inductor writes its cache folder into os.environ the first time anything compiles in this process
# (an in-process float8 or AutoModel test). Set it now to the folder it would pick, so this process's
# environment, which the warm servers (tests/warm_start.py) start with and compare runs against, stays put.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.abspath(default_cache_dir()))

# A rank's environment: the rendezvous, the rank, and the flight recorder a rank turns on for its collectives.
_JOB_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCH_FR_BUFFER_SIZE")


@pytest.fixture(autouse=True)
def _no_job_env_left_behind():
    """Fail a test that leaves a rank's environment in this process: every later launch of the session would
    inherit it (one leaked MASTER_PORT made two workers' runs collide; a leaked flight-recorder size made
    every warm server outdated)."""
    before = {key: os.environ.get(key) for key in _JOB_ENV}
    yield
    after = {key: os.environ.get(key) for key in _JOB_ENV}
    if after != before:
        changed = {key: value for key, value in after.items() if value != before[key]}
        os.environ.update({k: v for k, v in before.items() if v is not None})
        for key in [k for k, v in before.items() if v is None]:
            os.environ.pop(key, None)
        pytest.fail(f"the test left {changed} in os.environ", pytrace=False)


def _disabled_loggers() -> set[str]:
    return {name for name, logger in logging.root.manager.loggerDict.items()
            if isinstance(logger, logging.Logger) and logger.disabled}


@pytest.fixture(autouse=True)
def _no_logger_left_disabled():
    """Fail a test that leaves a logger of this worker disabled (a library's ``logging.config.dictConfig``
    disables every logger that exists): every later test here would find Primus' logs empty."""
    before = _disabled_loggers()
    yield
    disabled = _disabled_loggers() - before
    if disabled:
        for name in disabled:
            logging.getLogger(name).disabled = False
        pytest.fail(f"the test left {len(disabled)} loggers disabled ({', '.join(sorted(disabled)[:3])}, ...)",
                    pytrace=False)


@pytest.fixture(autouse=True)
def _no_process_group_left_behind():
    """Fail a test that leaves torch.distributed's default group in this worker: a later fake-world plan
    here refuses to build ("needs a process without a process group"), far from the cause."""
    yield
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        pytest.fail("the test left a torch.distributed process group initialized", pytrace=False)


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory) -> Path:
    """One tiny tokenizer + corpus for the whole session (built on first use by the runs)."""
    return tmp_path_factory.mktemp("primus-cache")


@pytest.fixture
def workspace(tmp_path) -> Path:
    return tmp_path / "ws"


@pytest.fixture
def run_primus(workspace, tiny_cache):
    """Run ``primus ARGS`` with PRIMUS_WORKSPACE/PRIMUS_CACHE pointing at temp dirs (``tests.helpers.run_cli``:
    a ``train`` is forked from a warm server where that is the same process; ``fresh=True``: never)."""

    def run(*args: str, env: dict[str, str] | None = None, timeout: int = 300, cwd: Path = ROOT, fresh: bool = False):
        full_env = {**os.environ, "PRIMUS_WORKSPACE": str(workspace), "PRIMUS_CACHE": str(tiny_cache),
                    "PYTHONUNBUFFERED": "1", **(env or {})}
        return run_cli(list(args), env=full_env, cwd=cwd, timeout=timeout, fresh=fresh)

    return run


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
