"""Line charts written as SVG text, with no plotting library: the figures a run and a sweep
leave (curves.svg, sweep.svg, search.svg). Writing one costs milliseconds, where importing
matplotlib and rendering a PNG took about 2 s of a 2-core machine; browsers, GitHub and
MLflow's artifact view show them.

A chart is a titled box of series, each a list of (x, y) points with a colour, optionally a
dash, a marker ("dot", "o" or "x"), steps (a value held until the next point) or error bars.
A point whose x or y is missing or not finite (a diverged loss) is left out, not drawn at an
edge. `page` lays charts out in a grid and returns the document.
"""
import math

WIDTH, HEIGHT = 360, 240  # one chart
LEFT, RIGHT, TOP, BOTTOM = 58, 26, 26, 44  # the margins of a chart's plot area
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
DASHES = {"dashed": "6,4", "dotted": "2,3", "dashdot": "6,3,2,3"}


def finite(v):
    return isinstance(v, (int, float)) and math.isfinite(v)


def escape(text):
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _span(values):
    """(low, high) of the values, widened where they are all one value."""
    low, high = min(values), max(values)
    if high == low:
        pad = abs(low) * 0.05 or 1.0
        low, high = low - pad, high + pad
    return low, high


def _number(v):
    return f"{v:.3g}"


def _marker(kind, a, b, color):
    if kind == "x":
        return (f'<path d="M{a - 4:.1f},{b - 4:.1f}L{a + 4:.1f},{b + 4:.1f}M{a - 4:.1f},{b + 4:.1f}'
                f'L{a + 4:.1f},{b - 4:.1f}" stroke="{color}" stroke-width="2"/>')
    r = 4 if kind == "o" else 2
    return f'<circle cx="{a:.1f}" cy="{b:.1f}" r="{r}" fill="{color}"/>'


def chart(x0, y0, title, xlabel, series, categories=None):
    """The SVG elements of one chart whose top left corner is (x0, y0). Each series is a dict:
    points [(x, y)], color, and optionally label (shown in the legend), key (kept as the line's
    data-key), dash ("dashed", "dotted", "dashdot"), marker, line (False: markers only),
    steps, errors ([spread] beside points). categories, [names], puts the names at x = 0, 1,
    ... below the axis, turned."""
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    px, py = x0 + LEFT, y0 + TOP
    out = [f'<text x="{x0 + WIDTH / 2:.1f}" y="{y0 + 17}" text-anchor="middle" '
           f'font-weight="bold">{escape(title)}</text>',
           f'<rect x="{px}" y="{py}" width="{w}" height="{h}" fill="none" stroke="#999"/>',
           f'<text x="{px + w / 2:.1f}" y="{y0 + HEIGHT - 4}" text-anchor="middle">'
           f'{escape(xlabel)}</text>']
    kept = [[(x, y) for x, y in s["points"] if finite(x) and finite(y)] for s in series]
    spreads = [e for s in series for e in s.get("errors", []) if finite(e)]
    points = [p for line in kept for p in line]
    if not points:
        return out + [f'<text x="{px + w / 2:.1f}" y="{py + h / 2:.1f}" text-anchor="middle">'
                      'no finite values</text>']
    xs = [x for x, _ in points] + ([-0.5, len(categories) - 0.5] if categories else [])
    ys = [y for _, y in points]
    top = max(ys) + max(spreads, default=0.0)
    (xl, xh), (yl, yh) = _span(xs), _span(ys + [top, min(ys) - max(spreads, default=0.0)])

    def at(x, y):
        return px + (x - xl) / (xh - xl) * w, py + h - (y - yl) / (yh - yl) * h
    for i in range(3):  # ticks at both ends and the middle, with their values
        fx, fy = xl + (xh - xl) * i / 2, yl + (yh - yl) * i / 2
        tx, ty = at(fx, fy)
        out += [f'<line x1="{px}" y1="{ty:.1f}" x2="{px + w}" y2="{ty:.1f}" stroke="#eee"/>',
                f'<text x="{px - 4}" y="{ty + 4:.1f}" text-anchor="end">{_number(fy)}</text>']
        if not categories:
            out += [f'<line x1="{tx:.1f}" y1="{py}" x2="{tx:.1f}" y2="{py + h}" stroke="#eee"/>',
                    f'<text x="{tx:.1f}" y="{py + h + 14}" text-anchor="middle">'
                    f'{_number(fx)}</text>']
    for i, name in enumerate(categories or []):
        tx, _ = at(i, yl)
        out.append(f'<text x="{tx:.1f}" y="{py + h + 12}" text-anchor="end" font-size="9" '
                   f'transform="rotate(-20 {tx:.1f} {py + h + 12})">{escape(name)}</text>')
    for s, line in zip(series, kept):
        color, xy = s["color"], [at(x, y) for x, y in line]
        if s.get("steps"):
            ends = zip(xy, xy[1:] + xy[-1:])
            xy = [p for a, b in ends for p in ((a[0], a[1]), (b[0], a[1]))][:-1]
        if s.get("line", True) and xy:
            dash = f' stroke-dasharray="{DASHES[s["dash"]]}"' if s.get("dash") else ""
            key = f' data-key="{escape(s["key"])}"' if s.get("key") else ""
            out.append(f'<polyline{key} points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in xy)}" '
                       f'fill="none" stroke="{color}" stroke-width="1.5"{dash}/>')
        if s.get("marker"):
            out += [_marker(s["marker"], *at(x, y), color) for x, y in line]
        for (x, y), e in zip(line, s.get("errors", [])):
            (a, b1), (_, b2) = at(x, y - e), at(x, y + e)
            out.append(f'<path d="M{a:.1f},{b1:.1f}V{b2:.1f}M{a - 4:.1f},{b1:.1f}H{a + 4:.1f}'
                       f'M{a - 4:.1f},{b2:.1f}H{a + 4:.1f}" stroke="{color}"/>')
    labelled = [s for s in series if s.get("label")]
    for i, s in enumerate(labelled[:8]):  # the legend, bottom right, inside the box
        ly = py + h - 8 - 13 * (min(len(labelled), 8) - 1 - i)
        out.append(f'<line x1="{px + w - 92}" y1="{ly - 4}" x2="{px + w - 78}" y2="{ly - 4}" '
                   f'stroke="{s["color"]}" stroke-width="2"/>'
                   f'<text x="{px + w - 74}" y="{ly}" font-size="10">{escape(s["label"])}</text>')
    return out


def page(charts, columns=3):
    """The SVG document of charts, [(title, xlabel, series, categories)], `columns` a row."""
    rows = math.ceil(len(charts) / columns)
    width, height = WIDTH * min(columns, len(charts)), HEIGHT * rows
    body = []
    for i, (title, xlabel, series, categories) in enumerate(charts):
        body += chart(WIDTH * (i % columns), HEIGHT * (i // columns), title, xlabel, series,
                      categories)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">\n'
            f'<rect width="{width}" height="{height}" fill="white"/>\n' + "\n".join(body)
            + "\n</svg>\n")
