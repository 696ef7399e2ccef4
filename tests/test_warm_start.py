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
