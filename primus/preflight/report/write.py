"""Write the report files on rank 0: report.json (source of truth), report.md, report.pdf, PNGs."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from primus.preflight.report.markdown import render_markdown


def write_report(report: dict[str, Any], report_dir: str | Path) -> dict[str, str]:
    out = Path(report_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": str(out / "report.json")}
    Path(paths["json"]).write_text(json.dumps(report, indent=2, sort_keys=False, default=str) + "\n")
    images: dict[str, str] = {}
    try:
        from primus.preflight.report.plots import render_plots

        images = render_plots(report, out)
    except ImportError:  # matplotlib is the optional [report] extra
        pass
    paths["markdown"] = str(out / "report.md")
    Path(paths["markdown"]).write_text(render_markdown(report, images))
    try:
        from primus.preflight.report.pdf import render_pdf

        render_pdf(report, images, out, out / "report.pdf")
        paths["pdf"] = str(out / "report.pdf")
    except ImportError:  # fpdf2 is the optional [report] extra
        pass
    return paths
