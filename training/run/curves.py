"""curves.svg: a run's history as five small charts: loss and accuracy (train and test), the
learning rate and training images/s by epoch, and test accuracy against training time.

Written as SVG text with no plotting library: a run's end costs milliseconds, where importing
matplotlib and rendering a PNG took about 2 s of a 2-core machine (a search trial's every epoch
ends a run). Browsers, GitHub and MLflow's artifact view show it. A value that is missing or
not finite (a diverged loss) is left out of its line, not drawn at an edge.
"""
import math

WIDTH, HEIGHT, COLUMNS = 360, 240, 3  # one chart, and charts a row
LEFT, RIGHT, TOP, BOTTOM = 58, 26, 26, 36  # the margins of a chart's plot area
COLORS = ("#1f77b4", "#ff7f0e")
CHARTS = (("loss", "epoch", (("train", "train_loss"), ("test", "test_loss"))),
          ("accuracy", "epoch", (("train", "train_acc"), ("test", "test_acc"))),
          ("test accuracy against training time", "train_time_s", (("test", "test_acc"),)),
          ("learning rate", "epoch", (("", "lr"),)),
          ("training images/s", "epoch", (("", "images_per_s"),)))
AXIS_NAMES = {"epoch": "epoch", "train_time_s": "training time (s)"}


def _span(values):
    """(low, high) of the values, widened where they are all one value."""
    low, high = min(values), max(values)
    if high == low:
        pad = abs(low) * 0.05 or 1.0
        low, high = low - pad, high + pad
    return low, high


def _number(v):
    return f"{v:.3g}"


def chart(x0, y0, title, x_key, series, history):
    """The SVG elements of one chart whose top left corner is (x0, y0)."""
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    px, py = x0 + LEFT, y0 + TOP

    def finite(r, key):
        return isinstance(r.get(key), (int, float)) and math.isfinite(r[key])
    lines = [[(r[x_key], r[key]) for r in history if finite(r, x_key) and finite(r, key)]
             for _, key in series]
    out = [f'<text x="{x0 + WIDTH / 2:.1f}" y="{y0 + 17}" text-anchor="middle" '
           f'font-weight="bold">{title}</text>',
           f'<rect x="{px}" y="{py}" width="{w}" height="{h}" fill="none" stroke="#999"/>',
           f'<text x="{px + w / 2:.1f}" y="{py + h + 30}" text-anchor="middle">'
           f'{AXIS_NAMES[x_key]}</text>']
    points = [p for line in lines for p in line]
    if not points:
        return out + [f'<text x="{px + w / 2:.1f}" y="{py + h / 2:.1f}" text-anchor="middle">'
                      'no finite values</text>']
    (xl, xh), (yl, yh) = _span([x for x, _ in points]), _span([y for _, y in points])

    def at(x, y):
        return px + (x - xl) / (xh - xl) * w, py + h - (y - yl) / (yh - yl) * h
    for i in range(3):  # ticks at both ends and the middle, with their values
        fx, fy = xl + (xh - xl) * i / 2, yl + (yh - yl) * i / 2
        tx, ty = at(fx, fy)
        out += [f'<line x1="{tx:.1f}" y1="{py}" x2="{tx:.1f}" y2="{py + h}" stroke="#eee"/>',
                f'<line x1="{px}" y1="{ty:.1f}" x2="{px + w}" y2="{ty:.1f}" stroke="#eee"/>',
                f'<text x="{tx:.1f}" y="{py + h + 14}" text-anchor="middle">{_number(fx)}</text>',
                f'<text x="{px - 4}" y="{ty + 4:.1f}" text-anchor="end">{_number(fy)}</text>']
    for i, ((label, key), line) in enumerate(zip(series, lines)):
        color, xy = COLORS[i], [at(x, y) for x, y in line]
        points = " ".join(f"{a:.1f},{b:.1f}" for a, b in xy)
        out.append(f'<polyline data-key="{key}" points="{points}" fill="none" stroke="{color}" '
                   'stroke-width="1.5"/>')
        out += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="2" fill="{color}"/>' for a, b in xy]
        if len(series) > 1:  # the legend, top right
            ly = py + 14 + 14 * i
            out.append(f'<line x1="{px + w - 52}" y1="{ly - 4}" x2="{px + w - 38}" y2="{ly - 4}" '
                       f'stroke="{color}" stroke-width="2"/>'
                       f'<text x="{px + w - 34}" y="{ly}">{label}</text>')
    return out


def svg(history):
    """The whole of curves.svg for the rows of metrics.csv (dicts of METRICS_COLUMNS)."""
    rows = math.ceil(len(CHARTS) / COLUMNS)
    width, height = WIDTH * COLUMNS, HEIGHT * rows
    body = []
    for i, (title, x_key, series) in enumerate(CHARTS):
        body += chart(WIDTH * (i % COLUMNS), HEIGHT * (i // COLUMNS), title, x_key, series, history)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">\n'
            f'<rect width="{width}" height="{height}" fill="white"/>\n' + "\n".join(body)
            + "\n</svg>\n")
