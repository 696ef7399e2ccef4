"""`primus plan --project` against published GPU throughput (benchmarks/published/corpus.yaml): every
row projected as the CLI does, one efficiency model per vendor, nothing fitted per row."""
from __future__ import annotations

from benchmarks.projection_published import CORPUS, MAPE_TARGET, WORST_TARGET, evaluate, load_corpus


def test_corpus_rows_name_an_experiment_a_device_a_number_and_a_source():
    rows = load_corpus()
    header = CORPUS.read_text().split("rows:")[0]
    assert len(rows) >= 15 and len({r["id"] for r in rows}) == len(rows)
    for row in rows:
        assert (CORPUS.parent / row["experiment"]).is_file(), row["id"]
        assert row["published"] > 0 and row["nodes"] >= 1 and row["gpus_per_node"] >= 1
        assert row["source"].split(",")[0].split(" ")[0] in header, row["id"]  # a source the header cites
    devices = {r["device"] for r in rows}
    assert {"h100", "h200", "b200", "mi325x", "mi355x"} <= devices
    assert any("fp8" in r["id"] for r in rows) and any("bf16" in r["id"] for r in rows)


def test_projection_meets_the_published_throughput():
    summary = evaluate(load_corpus())
    gated = [r for r in summary["rows"] if not r["out_of_model"]]
    assert len(gated) >= 15
    worst = max(gated, key=lambda r: abs(r["error"]))
    assert summary["mape"] <= MAPE_TARGET, f"MAPE {summary['mape']:.3f}"
    assert summary["worst"] <= WORST_TARGET, f"worst {worst['id']}: {worst['error']:+.3f}"
