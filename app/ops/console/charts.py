"""Small time-series charts drawn on the server as inline SVG.

Chosen over a JavaScript charting library (e.g. uPlot): no third-party code to ship or vendor,
nothing for ``make run`` to install, no change to the console's script-free CSP, and the charts
show in any browser with JavaScript off - the same page the tables already are.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

__all__ = ["sparkline"]


def sparkline(
    points: Sequence[tuple[float, float]],
    *,
    width: int = 160,
    height: int = 36,
    colour: str = "#2563eb",
    label: str = "",
) -> str:
    """An SVG polyline of ``(time, value)`` points scaled to the box, with its range as a title.

    Fewer than two points draw a flat "no data yet" chart (still an ``<svg>``, so the layout is stable).
    """
    title = html.escape(label)
    head = (
        f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{title}" xmlns="http://www.w3.org/2000/svg">'
    )
    if len(points) < 2:
        return (
            f"{head}<title>{title}: no data yet</title>"
            f'<line x1="0" y1="{height - 1}" x2="{width}" y2="{height - 1}" stroke="#d0d4da"/></svg>'
        )
    t0, t1 = points[0][0], points[-1][0]
    low = min(v for _, v in points)
    high = max(v for _, v in points)
    span_t = (t1 - t0) or 1.0
    span_v = (high - low) or 1.0
    pad = 2
    coords = " ".join(
        f"{(t - t0) / span_t * width:.1f},{height - pad - (v - low) / span_v * (height - 2 * pad):.1f}"
        for t, v in points
    )
    summary = f"{title}: {low:g} .. {high:g} over {t1 - t0:.0f} s"
    return (
        f"{head}<title>{html.escape(summary)}</title>"
        f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{coords}"/></svg>'
    )
