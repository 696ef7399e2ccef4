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
