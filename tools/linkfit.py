"""The network's bandwidth and latency from an allreduce's times at several message sizes, for
the line time = latency + 2 (N - 1) / N x bytes / bandwidth (tools/allreduce.py).

The bandwidth is read only from the sizes where the wire dominates: the largest sizes, down to
the first whose time is under twice the fastest size's. Over those it is the median of the
slopes between every pair of sizes (Theil-Sen), so no one size sets it: a slow largest size,
one slow small size and a token bucket's burst (small messages passed at once, the larger ones
paced) each move only some pairs; the smallest of those sizes is left out while its slope to
the next is over twice the others' rate (it passed partly in a burst). The interquartile range
of the pairs' slopes is reported as a range of bandwidths. With fewer than three such sizes the
largest message is too small to show the link, and the fit says so instead of giving a rate.
"""
import math
import statistics

WIRE = 2.0  # a size shows the link where it takes at least this many times the fastest size's time
MIN_SIZES = 3  # sizes the wire must dominate for a rate: three pairs of slopes
BURST = 2.0  # a smallest size whose slope to the next is this many times the rest's rate passed in a burst
DISAGREE = 0.15  # relative gap between the smaller and the larger half's rates that is reported


def sizes(total_bytes, smallest=4096, below=6, top=7):
    """Message sizes in bytes: `below` sizes in a geometric series from `smallest` up to a tenth
    of the model's total, and `top` sizes in a geometric series over the top decade, the model's
    total the largest (the top decade carries the bandwidth's fit)."""
    total = total_bytes // 4 * 4
    tenth = max(smallest, total / 10)
    out = {total}
    if below:
        ratio = (tenth / smallest) ** (1 / below)
        out |= {int(smallest * ratio ** i) // 4 * 4 for i in range(below)}
    ratio = (total / tenth) ** (1 / max(top - 1, 1))
    out |= {int(tenth * ratio ** i) // 4 * 4 for i in range(top - 1)}
    return sorted(b for b in out if 0 < b <= total)


def quantile(xs, q):
    """The q-quantile of xs, linear between the sorted values."""
    xs = sorted(xs)
    at = q * (len(xs) - 1)
    lo = math.floor(at)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (at - lo)


def rate(slope):
    """Bits per second from seconds per bit; None where the time does not grow."""
    return 1 / slope if slope > 0 else None


def pair_slopes(points):
    """Seconds per bit between every pair of [(bits, seconds)] of distinct sizes."""
    return [(t2 - t1) / (x2 - x1) for i, (x1, t1) in enumerate(points) for x2, t2 in points[i + 1:] if x2 > x1]


def fit(n, points):
    """The link from [(bytes, seconds or [seconds of each repeat])] of an allreduce among n
    processes, each size's time the median of its repeats: a dict of latency_s, bandwidth_bps
    (None where the sizes do not show the link), range_bps (the pairs' interquartile range, low
    and high), sizes (how many the rate rests on), at_least_bps (the largest size's bits over its
    whole time: never more than the link), reason (why there is no rate, else None) and note (a
    line where the smaller and larger sizes disagree, else None)."""
    per_bit = 2 * (n - 1) / n * 8
    pts = sorted((b * per_bit, statistics.median(s) if isinstance(s, (list, tuple)) else s) for b, s in points)
    floor = min(t for _, t in pts)
    wire = []
    for x, t in reversed(pts):
        if t < WIRE * floor:
            break
        wire.insert(0, (x, t))
    # The smallest of them passed partly in a burst where its slope to the next is far above the rest's rate.
    while len(wire) >= MIN_SIZES:
        (x0, t0), (x1, t1) = wire[:2]
        rest = rate(statistics.median(pair_slopes(wire[1:])))
        if not rest or x1 - x0 <= BURST * rest * (t1 - t0):
            break
        wire.pop(0)
    out = dict(latency_s=floor, bandwidth_bps=None, range_bps=None, sizes=len(wire),
               at_least_bps=pts[-1][0] / pts[-1][1], reason=None, note=None)
    if len(wire) < MIN_SIZES:
        out["reason"] = (f"only {len(wire)} size(s) took {WIRE:g} times the fastest size's time or more, past a "
                         f"burst: the largest message ({pts[-1][0] / per_bit / 1e6:.2f} MB) is too small to show the "
                         "link (its time is mostly latency, or it passed in a burst)")
        return out
    slopes = pair_slopes(wire)
    bandwidth = rate(statistics.median(slopes))
    if bandwidth is None:
        out["reason"] = f"the times of the largest {len(wire)} sizes do not grow with their size"
        return out
    high = rate(quantile(slopes, 0.25))
    out.update(bandwidth_bps=bandwidth, range_bps=(rate(quantile(slopes, 0.75)), high if high else math.inf),
               latency_s=max(out["latency_s"] - pts[0][0] / bandwidth, 0.0))
    # The halves' own rates: a link that slows large messages, or paces only past a burst.
    half = len(wire) // 2
    small, large = rate(statistics.median(pair_slopes(wire[:half + 1]))), rate(
        statistics.median(pair_slopes(wire[half:])))
    if small and large and abs(small - large) > DISAGREE * bandwidth:
        why = ("the larger ran slower: a link that slows large messages" if large < small
               else "the smaller ran slower")
        out["note"] = (f"the sizes disagree: {small / 1e6:.1f} Mbit/s from {wire[0][0] / per_bit / 1e6:.2f} to "
                       f"{wire[half][0] / per_bit / 1e6:.2f} MB, {large / 1e6:.1f} Mbit/s from there to "
                       f"{wire[-1][0] / per_bit / 1e6:.2f} MB ({why})")
    return out
