"""The preflight report: JSON is the source of truth; Markdown and PDF are renderings of it."""
from __future__ import annotations

from primus.preflight.report.build import build_report
from primus.preflight.report.write import write_report

__all__ = ["build_report", "write_report"]
