"""Whatever an instruction file, a run directory's config, a plan or preflight option or a pipeline layout
holds, the SFT reader, export's run-dir reader, the option parsers and the layout parser end in a value
or one error line (exit 0 or 2), never a traceback, within a time bound.

Property-based (hypothesis), as ``test_fuzz_inputs.py``: drawn JSONL lines and bytes, Parquet rows,
``config.resolved.yaml`` texts and documents, flag and variable values, layout strings. Examples are
few and small: the whole file stays well under a minute on a busy 2-core machine.
"""
from __future__ import annotations

import json
import os
import time
from datetime import timedelta

import pytest
import yaml

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.conftest import ROOT  # noqa: E402
from tests.fault_tolerance.test_fuzz_inputs import BOUND_S, _ends_well, documents, yaml_text  # noqa: E402

EXAMPLES = int(os.environ.get("PRIMUS_T_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=timedelta(seconds=BOUND_S), database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# -- SFT records ---------------------------------------------------------------------------------------
class _Tokenizer:
    bos_token, chat_template = "", None


def _read_and_render(path):
    from primus.data.sft import read_records, render

    for where, record in read_records(path):
        render(record, _Tokenizer(), "auto", where)


KEYS = st.sampled_from(["prompt", "response", "instruction", "input", "output", "messages", "system", "question",
                        "context", "answers", "role", "content", "x"])
records = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(),
                                 st.text(max_size=12)),
                       lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(KEYS, inner, max_size=4)),
                       max_leaves=12)


@FUZZ
@given(lines=st.lists(st.one_of(records.map(lambda r: json.dumps(r).encode()), st.binary(max_size=40),
                                st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass"))),
                      min_size=1, max_size=5))
def test_sft_jsonl(lines, tmp_path_factory):
    path = tmp_path_factory.mktemp("sft") / "data.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    _ends_well(lambda: _read_and_render(path))


@settings(FUZZ, max_examples=max(5, EXAMPLES // 4))
@given(rows=st.lists(st.dictionaries(st.sampled_from(["prompt", "response", "instruction", "output", "input"]),
                                     st.one_of(st.text(max_size=10), st.integers(), st.none()), min_size=1,
                                     max_size=3), min_size=1, max_size=4),
       junk=st.binary(max_size=30))
def test_sft_parquet(rows, junk, tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path_factory.mktemp("parquet")
    try:
        pq.write_table(pa.Table.from_pylist(rows), folder / "train.parquet")
    except (pa.ArrowException, TypeError, ValueError, OverflowError):  # rows pyarrow cannot type: write the junk instead
        (folder / "train.parquet").write_bytes(junk)
    _ends_well(lambda: _read_and_render(folder))
    (folder / "train.parquet").write_bytes(junk)
    _ends_well(lambda: _read_and_render(folder))


# -- export's run-dir reading --------------------------------------------------------------------------
@FUZZ
@given(text=st.one_of(yaml_text, documents.map(lambda d: yaml.safe_dump({"modules": {"pre_trainer": d}}))))
def test_run_dir_config(text, tmp_path_factory):
    from primus.runtime.rundir import RunDir

    run = tmp_path_factory.mktemp("run")
    (run / "config.resolved.yaml").write_text(text, encoding="utf-8")
    _ends_well(lambda: RunDir(run).read_module())


@settings(FUZZ, max_examples=max(5, EXAMPLES // 4))
@given(text=yaml_text)
def test_export_command(text, tmp_path_factory, capsys):
    """``primus export`` end to end over a drawn config: exit 2 and one line (no checkpoint is ever found)."""
    from primus.cli.main import main

    run = tmp_path_factory.mktemp("export")
    (run / "config.resolved.yaml").write_text(text, encoding="utf-8")
    start = time.monotonic()
    code = main(["export", str(run), "--to", "hf", str(run / "out")])
    err = capsys.readouterr().err
    assert time.monotonic() - start < BOUND_S and code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and err.startswith("primus: error: ")
    assert not (run / "out").exists()


# -- plan / preflight options --------------------------------------------------------------------------
values = st.one_of(st.integers(-(10**30), 10**30).map(str), st.floats().map(str), st.text(max_size=12),
                   st.sampled_from(["", " ", "nan", "inf", "-inf", "0", "-1", "1e9", "0x10", "٣"]))


@FUZZ
@given(nproc=st.one_of(st.none(), values), nnodes=st.one_of(st.none(), values),
       env=st.dictionaries(st.sampled_from(["GPUS_PER_NODE", "NNODES", "WORLD_SIZE"]),
                           values.filter(lambda v: "\x00" not in v), max_size=3))
def test_world_size_options(nproc, nnodes, env):
    from primus.launch.plan import world_size_of
    from primus.config.values import count_flag

    def parse():
        flags = [None if v is None else count_flag(1)(v) for v in (nproc, nnodes)]
        return world_size_of(*flags, env=env)

    try:
        _ends_well(parse)
    except Exception as exc:  # argparse's own error type for a flag: one line too
        import argparse

        assert isinstance(exc, argparse.ArgumentTypeError) and "\n" not in str(exc)


@FUZZ
@given(timeout=values, thresholds=documents, report=st.text(max_size=20).filter(lambda v: "\x00" not in v))
def test_preflight_options(timeout, thresholds, report, tmp_path_factory):
    from primus.preflight.options import PreflightOptions
    from primus.plan.thresholds import load_thresholds

    folder = tmp_path_factory.mktemp("pre")
    path = folder / "t.yaml"
    path.write_text(yaml.safe_dump(thresholds, allow_unicode=True), encoding="utf-8")
    _ends_well(lambda: load_thresholds(path))
    _ends_well(lambda: PreflightOptions(timeout=timeout, report_dir=str(folder / report) if report else ""))


@settings(FUZZ, max_examples=max(5, EXAMPLES // 5), deadline=None)  # the first call imports the planner
@given(flag=st.sampled_from(["--nproc-per-node", "-N", "--device"]), value=values)
def test_plan_command(flag, value, capsys):
    from primus.cli.main import main

    start = time.monotonic()
    code = main(["plan", str(ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml"), flag, value])
    err = capsys.readouterr().err
    assert time.monotonic() - start < BOUND_S * 4  # a whole plan, Megatron's argument checks included
    assert code in (0, 1, 2) and "Traceback" not in err, err  # 1: does not fit or a wrong layout (said as such)
    assert code != 2 or (len(err.strip().splitlines()) == 1 and err.startswith("primus: error: "))


# -- pipeline layouts ----------------------------------------------------------------------------------
layouts = st.lists(st.one_of(st.sampled_from(["E", "t", "m", "L", "|", ",", "(", ")", "*", "x"]),
                             st.integers(0, 10**15).map(lambda n: f"*{n}"),
                             st.integers(0, 10**15).map(lambda n: f"(t|)*{n}")), max_size=12).map("".join)


@FUZZ
@given(layout=layouts, layers=st.one_of(st.none(), st.integers(0, 500)))
def test_pipeline_layouts(layout, layers):
    from primus.plan.layout import layout_bound, parse_pipeline_layout

    stages = _ends_well(lambda: parse_pipeline_layout(layout, layers))
    if isinstance(stages, list):
        assert sum(map(len, stages)) + len(stages) - 1 <= layout_bound(layers)
