"""The ratios as an SVG bar chart, written by hand: no plotting library to install.

One horizontal bar per measured workload, its length the median ratio on a linear scale
from 0, with a vertical line at 1.0 (no gain) and a mark at each repetition's ratio. Bars
that did not reach their goal are drawn in another colour; skipped and failed workloads are
listed with their reason instead of a bar.
"""

from __future__ import annotations

from html import escape

from reame_core.bench.host import describe_host
from reame_core.bench.report import Report

_ROW = 28
_LABEL = 230
_BARS = 420
_RIGHT = 170
_TOP = 56
PAID, NOT_PAID = "#2f7d4f", "#c0392b"


def render(report: Report) -> str:
    rows = list(report.rows)
    measured = [r for r in rows if r.ratio is not None]
    top = max(
        [1.5, *(r.ratio or 0 for r in measured), *(x for r in measured for x in r.ratio_by_rep)]
    )
    scale = _BARS / (top * 1.05)
    width = _LABEL + _BARS + _RIGHT
    height = _TOP + _ROW * len(rows) + 40
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        '<text x="10" y="20" font-size="14" font-weight="bold">'
        f"Reame {escape(report.reame['reame'])}: feature against baseline "
        f"(x times, median of {report.reps})</text>",
        f'<text x="10" y="38" fill="#555">{escape(describe_host(report.host))}; '
        f"{escape(report.model['file'])}; {escape(report.date)}</text>",
    ]
    for i, row in enumerate(rows):
        y = _TOP + i * _ROW
        out.append(f'<text x="10" y="{y + 17}">{escape(row.workload)}</text>')
        if row.ratio is None:
            reason = row.skipped or row.failed or ""
            label = ("skipped: " if row.skipped else "failed: ") + reason
            out.append(f'<text x="{_LABEL}" y="{y + 17}" fill="#888">{escape(label[:90])}</text>')
            continue
        colour = PAID if row.paid else NOT_PAID
        length = max(1.0, row.ratio * scale)
        out.append(
            f'<rect x="{_LABEL}" y="{y + 5}" width="{length:.1f}" height="{_ROW - 10}" '
            f'fill="{colour}"><title>{escape(row.title)}</title></rect>'
        )
        for each in row.ratio_by_rep:
            x = _LABEL + each * scale
            out.append(
                f'<line x1="{x:.1f}" y1="{y + 3}" x2="{x:.1f}" y2="{y + _ROW - 3}" '
                'stroke="black" stroke-width="1"/>'
            )
        out.append(f'<text x="{_LABEL + length + 6:.1f}" y="{y + 17}">{row.ratio:.2f}x</text>')
    one = _LABEL + scale
    bottom = _TOP + _ROW * len(rows)
    out.append(
        f'<line x1="{one:.1f}" y1="{_TOP - 4}" x2="{one:.1f}" y2="{bottom + 4}" '
        'stroke="#333" stroke-dasharray="4 3"/>'
    )
    out.append(f'<text x="{one - 8:.1f}" y="{bottom + 18}" fill="#333">1.0</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
