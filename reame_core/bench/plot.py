"""The ratios as an SVG bar chart, written by hand: no plotting library to install.

One horizontal bar per measured workload, from the vertical line at 1.0 (no gain) to its
median ratio, on a logarithmic scale (a disk cache's 30x and a governor's 0.97x on one
chart), with a mark at each repetition's ratio. Bars that did not reach their goal are drawn
in another colour; skipped and failed workloads are listed with their reason instead.
"""

from __future__ import annotations

import math
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
    ratios = [x for r in rows if r.ratio is not None for x in (r.ratio, *r.ratio_by_rep)]
    low = math.log(min([0.5, *ratios]) / 1.1)
    high = math.log(max([2.0, *ratios]) * 1.1)

    def x_of(ratio: float) -> float:
        return _LABEL + _BARS * (math.log(ratio) - low) / (high - low)

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
        left, right = sorted((x_of(1.0), x_of(row.ratio)))
        out.append(
            f'<rect x="{left:.1f}" y="{y + 5}" width="{max(1.0, right - left):.1f}" '
            f'height="{_ROW - 10}" fill="{colour}"><title>{escape(row.title)}</title></rect>'
        )
        for each in row.ratio_by_rep:
            x = x_of(each)
            out.append(
                f'<line x1="{x:.1f}" y1="{y + 3}" x2="{x:.1f}" y2="{y + _ROW - 3}" '
                'stroke="black" stroke-width="1"/>'
            )
        out.append(
            f'<text x="{max(right, x_of(1.0)) + 6:.1f}" y="{y + 17}">{row.ratio:.2f}x</text>'
        )
    one = x_of(1.0)
    bottom = _TOP + _ROW * len(rows)
    out.append(
        f'<line x1="{one:.1f}" y1="{_TOP - 4}" x2="{one:.1f}" y2="{bottom + 4}" '
        'stroke="#333" stroke-dasharray="4 3"/>'
    )
    out.append(f'<text x="{one - 8:.1f}" y="{bottom + 18}" fill="#333">1.0</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
