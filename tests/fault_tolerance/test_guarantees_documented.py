"""README's reliability section states what is guaranteed in the same words as the tests that check it:
each guarantee opens the docstring of its test module and appears, verbatim, in README.md."""
import ast
import re

import pytest

from tests.conftest import ROOT

GUARANTEES = {
    "test_bad_inputs.py": "Bad input is one line, exit 2, nothing written.",
    "test_fuzz_inputs.py": "Whatever a YAML file, an override token or an environment variable holds, the loader, "
                           "the interpolation and the override parser end in a value or one error line (exit 0 or "
                           "2), never a traceback, within a time bound.",
    "test_secrets.py": "Secrets reach the workers intact and appear nowhere else.",
    "test_checkpoints.py": "Resuming verifies the checkpoint first",
    "test_run_dir.py": "The run dir's bookkeeping survives faults",
    "test_stragglers.py": "A slow rank is named within two report intervals.",
    "test_hangs.py": "A hung job names the rank it waits for, then exits.",
    "test_option_values.py": "Plan, preflight and train options are checked before anything runs",
    "test_export_faults.py": "An export is whole or absent",
    "test_sft_inputs.py": "Instruction data that cannot be read is one line naming the file:line, exit 2",
    "test_resume_shapes.py": "A resume whose checkpoint does not match the model is refused before any step",
    "test_races.py": "Shared caches and outputs take a lock",
    "test_fuzz_readers.py": "Whatever an instruction file, a run directory's config, a plan or preflight option or a "
                            "pipeline layout holds, the SFT reader, export's run-dir reader, the option parsers and "
                            "the layout parser end in a value or one error line (exit 0 or 2), never a traceback, "
                            "within a time bound.",
}
EXTRA = {  # further sentences README and a test docstring share word for word
    "test_secrets.py": "A planted literal token appears in no file of the run dir, no dry-run output, no error "
                       "line; the workers still receive it.",
    "test_run_dir.py": "Launcher failures are one line",
    "test_failures.py": "With injected faults, the parts of the goodput add up to the run's wall time, with the "
                        "recomputed steps as lost work and the restart's time as restarts.",
}


def _words(text: str) -> str:
    return " ".join(re.sub(r"[*`]", "", text).split())


@pytest.mark.parametrize("module", sorted(GUARANTEES))
def test_each_guarantee_is_stated_by_readme_and_its_tests(module):
    readme = _words((ROOT / "README.md").read_text())
    docstring = _words(ast.get_docstring(ast.parse((ROOT / "tests" / "fault_tolerance" / module).read_text())))
    for sentence in [GUARANTEES[module], *([EXTRA[module]] if module in EXTRA else [])]:
        assert _words(sentence) in readme, sentence
        assert _words(sentence) in docstring, sentence
    assert docstring.startswith(_words(GUARANTEES[module]))


@pytest.mark.parametrize("module", sorted(set(EXTRA) - set(GUARANTEES)))
def test_further_promises_are_stated_by_readme_and_their_tests(module):
    readme = _words((ROOT / "README.md").read_text())
    docstring = _words(ast.get_docstring(ast.parse((ROOT / "tests" / "fault_tolerance" / module).read_text())))
    assert _words(EXTRA[module]) in readme and _words(EXTRA[module]) in docstring
