"""`primus data wan-tiny|wan-preprocess` and `primus prepare` through the real CLI entry point."""
from __future__ import annotations

from primus.cli.main import build_parser, main
from primus.data.diffusion import cli as data_cli


def test_data_commands(tmp_path, capsys):
    rc = main(["data", "wan-tiny", "-o", str(tmp_path), "--only", "videos", "--clips", "2", "--caption-format", "csv"])
    assert rc == 0
    assert (tmp_path / "videos" / "metadata.csv").exists() and len(list((tmp_path / "videos").glob("*.mp4"))) == 2
    args = build_parser().parse_args(["data", "wan-preprocess", str(tmp_path / "videos"), "--pipeline", "p", "-o", "c",
                                      "--num-frames", "9", "--height", "64", "--width", "64"])
    assert (args.num_frames, args.height, args.handler) == (9, 64, data_cli._preprocess)


def test_prepare_dry_run(capsys):
    assert main(["prepare", "automodel", "--dry-run", "--force"]) == 0
    assert "--no-deps nemo-automodel==0.7.0" in capsys.readouterr().out


def test_tiny_pipeline_takes_wider_experts(tmp_path):
    """The benchmarks' small Wan: both experts get the override, the text encoder/VAE stay tiny."""
    import json

    import pytest

    pytest.importorskip("diffusers")
    from primus.data.diffusion.tiny import TINY_TRANSFORMER, build_tiny_pipeline

    out = build_tiny_pipeline(tmp_path / "pipe", transformer={"num_layers": 3, "ffn_dim": 96})
    for expert in ("transformer", "transformer_2"):
        config = json.loads((out / expert / "config.json").read_text())
        assert (config["num_layers"], config["ffn_dim"]) == (3, 96)
        assert config["attention_head_dim"] == TINY_TRANSFORMER["attention_head_dim"]
