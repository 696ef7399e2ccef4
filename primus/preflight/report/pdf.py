"""The report as PDF (fpdf2): summary, findings, ranks, measurements and the plots."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from primus.preflight.report.tables import (collective_tables, hosts_label, measurement_table, node_sections, rank_table,
                                           topologies)

LEVEL_COLOURS = {"fail": (200, 40, 40), "warn": (190, 120, 0), "info": (60, 60, 60)}


def _text(value: Any) -> str:
    """fpdf2's core fonts are Latin-1: replace anything else rather than fail."""
    return str(value).encode("latin-1", "replace").decode("latin-1")


def render_pdf(report: dict[str, Any], images: dict[str, str], out_dir: Path, path: Path) -> None:
    from fpdf import FPDF

    pdf = FPDF(orientation="P", unit="mm", format="A4")
    pdf.set_auto_page_break(True, margin=12)
    pdf.add_page()
    pdf.set_font("Helvetica", "B", 16)
    pdf.set_text_color(*LEVEL_COLOURS["fail" if report["status"] == "fail" else "info"])
    pdf.cell(0, 10, _text(f"Primus preflight: {report['status'].upper()}"), new_x="LMARGIN", new_y="NEXT")
    pdf.set_text_color(0, 0, 0)
    pdf.set_font("Helvetica", size=9)
    world, counts = report["world"], report["counts"]
    pdf.multi_cell(0, 5, _text(f"{report['created']}  world size {world['world_size']}, {len(world['joined'])} joined, "
                               f"device {world['device']}, exit status {report['exit_code']} ({counts['fail']} fail, "
                               f"{counts['warn']} warn)"), new_x="LMARGIN", new_y="NEXT")

    def heading(title: str) -> None:
        pdf.ln(3)
        pdf.set_font("Helvetica", "B", 12)
        pdf.cell(0, 8, _text(title), new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("Helvetica", size=8)

    def grid(headers: list[str], rows: list[list[Any]], widths: tuple[int, ...] | None = None) -> None:
        with pdf.table(col_widths=widths, text_align="LEFT", line_height=4.5) as tbl:
            header = tbl.row()
            for h in headers:
                header.cell(_text(h))
            for row in rows:
                cells = tbl.row()
                for value in row:
                    cells.cell(_text(value))

    heading("Findings")
    grid(["level", "check", "message", "ranks"],
         [[f["level"].upper(), f["check"], f["message"], ",".join(map(str, f["ranks"]))[:40]] for f in report["findings"]],
         (10, 18, 60, 12))
    def note_and_grid(note: str | None, headers: list[str], rows: list[list[Any]]) -> None:
        if note:
            pdf.multi_cell(0, 4.5, _text(note), new_x="LMARGIN", new_y="NEXT")
        grid(headers, rows)

    for title, note, headers, rows in node_sections(report):
        heading(title)
        note_and_grid(note, headers, rows)
    heading("Ranks")
    note_and_grid(*rank_table(report))
    for hosts, text in topologies(report):
        heading(f"GPU topology: {hosts_label(hosts)}")
        pdf.set_font("Courier", size=6)
        pdf.multi_cell(0, 3, _text(text), new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("Helvetica", size=8)
    m = report["measurements"]
    if m["gemm"]:
        heading("GEMM per rank")
        note_and_grid(*measurement_table(report, "gemm"))
        if "gemm" in images:
            pdf.image(str(out_dir / images["gemm"]), w=170)
    if m["membw"]:
        heading("Memory bandwidth per rank")
        note_and_grid(*measurement_table(report, "membw"))
    if m["collectives"]:
        heading("Collectives")
        pdf.multi_cell(0, 4.5, _text("busbw (nccl-tests): " + "; ".join(f"{op}: {f}" for op, f in report["formulas"]["busbw"].items())),
                       new_x="LMARGIN", new_y="NEXT")
        if "busbw" in images:
            pdf.image(str(out_dir / images["busbw"]), w=170)
        for title, headers, rows in collective_tables(report):
            pdf.set_font("Helvetica", "B", 9)
            pdf.cell(0, 6, _text(title), new_x="LMARGIN", new_y="NEXT")
            pdf.set_font("Helvetica", size=8)
            grid(headers, rows)
    pdf.output(str(path))
