"""Whatever a YAML file, an override token or an environment variable holds, the loader, the
interpolation and the override parser end in a value or one error line (exit 0 or 2), never a
traceback, within a time bound.

Property-based (hypothesis): drawn almost-YAML text, bytes, documents, tokens and values.

Examples are few and small (the suite's added time stays a few seconds); hypothesis keeps no
database here, so every run draws afresh.
"""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
import yaml

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from primus.cli.main import main  # noqa: E402
from primus.config.errors import ConfigError  # noqa: E402
from primus.config.interpolate import interpolate_string  # noqa: E402
from primus.config.overrides import overrides_layer, parse_overrides  # noqa: E402
from primus.config.yaml_source import load_yaml_layer  # noqa: E402
from tests.conftest import TINY_EXAMPLE  # noqa: E402

BOUND_S = 5.0  # per example; generous for a busy 2-core machine, far below "unbounded"
FUZZ = settings(max_examples=int(__import__("os").environ.get("PRIMUS_T_FUZZ_EXAMPLES", "60")), deadline=timedelta(seconds=BOUND_S), database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# YAML's significant characters, so that drawn text is mostly almost-YAML rather than plain words
YAML_CHARS = st.sampled_from(list(":-[]{}&*!|>'\"%@`#,?<=~.$ \t\n") + ["${", "<<", "---", "\x00", "\x07", "\ufeff",
                                                                       "é", "9" * 30, "key", "a", "1"])
yaml_text = st.lists(st.one_of(YAML_CHARS, st.text(max_size=8)), max_size=60).map("".join)
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
documents = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                           st.dictionaries(st.text(max_size=10), inner, max_size=4)),
                         max_leaves=30)


def _ends_well(call) -> object:
    """The value, or a ConfigError: anything else (a traceback) fails; so does a slow answer."""
    start = time.monotonic()
    try:
        return call()
    except ConfigError as error:
        assert str(error) and "\n" not in str(error)
        return error
    finally:
        assert time.monotonic() - start < BOUND_S


@FUZZ
@given(text=yaml_text)
def test_arbitrary_yaml_text(text, tmp_path_factory):
    path = tmp_path_factory.mktemp("y") / "exp.yaml"
    path.write_text(text, encoding="utf-8")
    _ends_well(lambda: load_yaml_layer(path, "experiment"))


@FUZZ
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes(data, tmp_path_factory):
    path = tmp_path_factory.mktemp("b") / "exp.yaml"
    path.write_bytes(data)
    _ends_well(lambda: load_yaml_layer(path, "experiment"))


@FUZZ
@given(document=documents)
def test_arbitrary_yaml_documents(document, tmp_path_factory):
    path = tmp_path_factory.mktemp("d") / "exp.yaml"
    path.write_text(yaml.safe_dump({"root": document}, allow_unicode=True), encoding="utf-8")
    _ends_well(lambda: load_yaml_layer(path, "experiment"))


@FUZZ
@given(tokens=st.lists(st.one_of(yaml_text, st.builds("{}={}".format, st.text(max_size=12), yaml_text),
                                 st.builds("--{}".format, st.text(max_size=12))), max_size=6))
def test_arbitrary_override_tokens(tokens):
    _ends_well(lambda: overrides_layer(parse_overrides(tokens)))


@FUZZ
@given(value=st.text(max_size=80).filter(lambda v: "\x00" not in v), template=yaml_text)
def test_arbitrary_environment_values_and_templates(value, template):
    env = {"PRIMUS_T_FUZZ": value}
    _ends_well(lambda: interpolate_string("${PRIMUS_T_FUZZ}", "exp.yaml:1", env=env))
    _ends_well(lambda: interpolate_string(f"x${{PRIMUS_T_FUZZ:{value}}}y", "exp.yaml:1", env={}))
    _ends_well(lambda: interpolate_string(template, "exp.yaml:1", env=env))


@settings(FUZZ, max_examples=25)
@given(extra=yaml_text, tokens=st.lists(st.builds("{}={}".format, st.sampled_from(
    ["training.steps", "exp_name", "workspace", "primus.hf_token", "model.dim", "logging.level", "a.b"]),
    yaml_text), max_size=3))
def test_the_cli_exits_0_or_2_never_a_traceback(extra, tokens, tmp_path_factory, capsys):
    """``primus config show`` end to end: an example plus a drawn tail and drawn overrides."""
    path = tmp_path_factory.mktemp("c") / "exp.yaml"
    path.write_text(TINY_EXAMPLE.read_text() + extra, encoding="utf-8")
    start = time.monotonic()
    code = main(["config", "show", str(path), *tokens])
    err = capsys.readouterr().err
    assert time.monotonic() - start < BOUND_S
    assert code in (0, 2), err
    assert "Traceback" not in err and (code == 0 or err.startswith("primus: error: "))
