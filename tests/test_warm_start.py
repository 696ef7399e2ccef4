"""The warm start's judgement of when a forked child is the process a fresh interpreter would be."""
from tests.warm_start import differences

RECORDED = {"cwd": "/", "reads": {"PYTEST_CURRENT_TEST": None, "HF_HOME": None}, "prefixes": []}


def test_pytests_current_test_counts_by_presence_not_by_its_per_test_value():
    server = {"PYTEST_CURRENT_TEST": "tests/a.py::test_one (call)", "HF_HOME": "/h"}
    later_test = {**server, "PYTEST_CURRENT_TEST": "tests/b.py::test_two (call)"}
    assert differences(RECORDED, server, later_test, "/") == []
    assert differences(RECORDED, server, {"HF_HOME": "/h"}, "/") == ["PYTEST_CURRENT_TEST"]


def test_a_value_read_at_import_still_counts_whole():
    server = {"PYTEST_CURRENT_TEST": "x", "HF_HOME": "/h"}
    assert differences(RECORDED, server, {**server, "HF_HOME": "/other"}, "/") == ["HF_HOME"]
    assert differences(RECORDED, server, server, "/elsewhere") == ["cwd /elsewhere"]


def test_a_module_iterating_the_environment_records_the_iteration_not_every_variable():
    """tqdm reads ``os.environ.items()`` at import for its TQDM_ prefix: every variable present was recorded as
    read, so a warm server for ranks refused the next test's ranks over its PRIMUS_WORKSPACE."""
    import os

    from tests.warm_start import _RecordingEnviron

    reads, iterated = set(), []
    recording = _RecordingEnviron(os.environ, reads, iterated)
    prefixed = [key for key, _ in recording.items() if key.startswith("TQDM_")]
    assert prefixed == [] and reads == set() and iterated == [__name__]
    recording.get("HF_HOME")
    _ = "XDG_CACHE_HOME" in recording
    assert reads == {"HF_HOME", "XDG_CACHE_HOME"}  # a read by name counts
