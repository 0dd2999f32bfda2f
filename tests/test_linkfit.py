"""The allreduce probe's fit of a link (tools/linkfit.py, tools.allreduce.fit_line), in process,
on (size, time) points made here or recorded by the probe: a straight line exactly; a token
bucket's burst, one slow small size and a slow largest size each without moving the rate; sizes
too small to show the link refused with a reason."""
import pytest

from tools import allreduce, linkfit

RESNET18_BYTES = 44_695_848  # the models' gradients in fp32
LENET_BYTES = 248_024


def line(n, nbytes, rate, latency):
    """The probe's sizes for a model of nbytes, timed on an ideal link."""
    return [(b, latency + 2 * (n - 1) / n * b * 8 / rate) for b in linkfit.sizes(nbytes)]


def recorded_sizes(total, smallest=4096, steps=10):
    """The sizes an earlier probe took (a geometric series of 10), at which the times below were recorded."""
    ratio = (total / smallest) ** (1 / (steps - 1))
    return sorted({int(smallest * ratio ** i) // 4 * 4 for i in range(steps)} | {total // 4 * 4})


def test_the_probes_sizes_rest_on_the_top_decade():
    got = linkfit.sizes(RESNET18_BYTES)
    assert got == sorted(set(got)) and got[0] == 4096 and got[-1] == RESNET18_BYTES // 4 * 4
    assert sum(b >= RESNET18_BYTES / 10 for b in got) >= 6, got
    assert len(linkfit.sizes(RESNET18_BYTES, below=1, top=4)) == 5


def test_a_straight_line_is_fitted_exactly():
    n, rate, lat = 4, 100e6, 1e-3
    points = line(n, LENET_BYTES, rate, lat)
    assert allreduce.fit_line(n, points) == pytest.approx((lat, rate))
    got = linkfit.fit(n, points)
    assert got["range_bps"] == pytest.approx((rate, rate)) and got["note"] is None and got["reason"] is None
    # Each size's repeats: the median is taken, so one fast and one slow repeat do not count.
    repeats = [(b, [t * 0.5, t, t, t * 3]) for b, t in points]
    assert linkfit.fit(n, repeats)["bandwidth_bps"] == pytest.approx(rate)


def test_a_token_buckets_burst_does_not_read_as_speed():
    # 100 Mbit/s behind a 60 KB bucket (refilled while the ranks meet): the sizes under it pass
    # at once, the larger ones are paced past it. A slope from a small size reads 130 Mbit/s.
    n, rate, lat, burst = 2, 100e6, 1e-3, 60_000
    points = [(b, lat + max(0, b - burst) * 8 / rate) for b in linkfit.sizes(LENET_BYTES)]
    assert allreduce.fit_line(n, points)[1] == pytest.approx(rate, rel=0.02)
    # Recorded at 2 processes over 50 Mbit/s links (ms): the bucket held 62 KB.
    ms = [1.2, 1.2, 1.1, 1.0, 1.4, 5.5, 10.3, 15.4, 25.1, 41.3]
    latency, bandwidth = allreduce.fit_line(2, [(b, t / 1e3) for b, t in zip(recorded_sizes(242_460), ms)])
    assert 0 < latency < 1.2e-3 and 0.9 * 50e6 < bandwidth < 1.1 * 50e6, (latency, bandwidth)
    # Another run's, each size its fastest repeat: the refilled bucket sped two of the three
    # largest sizes past the rate. The rate is then too high, but the sizes' range holds the
    # link, and the fit says the sizes disagree.
    ms = [1.17, 1.18, 1.13, 1.13, 1.34, 5.70, 9.47, 12.2, 18.2, 38.8]
    got = linkfit.fit(2, [(b, t / 1e3) for b, t in zip(recorded_sizes(242_460), ms)])
    assert got["range_bps"][0] < 50e6 < got["range_bps"][1] and "the sizes disagree" in got["note"], got


def test_one_slow_small_size_does_not_move_the_rate():
    # Recorded at 4 processes over 50 Mbit/s links (ms): the smallest size came out slower than
    # the three above it, whose 5.5 ms is the latency. A slope from the smallest size reads 56 Mbit/s.
    ms = [14.73, 10.24, 5.48, 9.16, 7.67, 7.56, 12.1, 22.67, 36.41, 58.02]
    latency, bandwidth = allreduce.fit_line(4, [(b, t / 1e3) for b, t in zip(recorded_sizes(248_024), ms)])
    assert 4e-3 < latency < 5.5e-3 and 0.95 * 50e6 < bandwidth < 1.05 * 50e6, (latency, bandwidth)


def test_a_slow_largest_size_does_not_set_the_rate():
    # ResNet-18's sizes at 95 Mbit/s, the largest 57% slow (5.63 s where 3.58 s was due): a fit
    # bounded by the slope to the largest size reads 60 Mbit/s.
    n, rate = 2, 95e6
    points = line(n, RESNET18_BYTES, rate, 2e-3)
    slow = points[:-1] + [(points[-1][0], points[-1][1] * 5.63 / 3.58)]
    assert allreduce.fit_line(n, slow)[1] == pytest.approx(rate, rel=0.02)
    # The two largest 50% slow: still the rate, and a line that the larger sizes disagree.
    slower = points[:-2] + [(b, t * 1.5) for b, t in points[-2:]]
    got = linkfit.fit(n, slower)
    assert got["bandwidth_bps"] == pytest.approx(rate, rel=0.02), got
    assert got["range_bps"][0] < rate, got
    assert "(the larger ran slower: a link that slows large messages)" in got["note"], got


def test_sizes_too_small_to_show_the_link_give_no_rate_but_a_reason():
    # LeNet at 100 Mbit/s behind the 125 KB bucket local_cluster.sh gives that rate: only its
    # two largest sizes wait for the rate, too few to read it.
    n, rate, lat, burst = 2, 100e6, 1e-3, 125_000
    points = [(b, lat + max(0, b - burst) * 8 / rate) for b in linkfit.sizes(LENET_BYTES)]
    got = linkfit.fit(n, points)
    assert got["bandwidth_bps"] is None and "too small to show the link" in got["reason"], got
    assert got["at_least_bps"] > 0 and allreduce.fit_line(n, points)[1] is None
    # Recorded (ms, each size's median) at 2 processes over 100 Mbit/s links on a loaded host:
    # the largest size took less than its bytes need at the rate (15.4 ms of 21 ms), and the
    # slope from the smallest size read 160 Mbit/s.
    ms = [4.97, 7.14, 3.19, 8.91, 9.57, 4.23, 4.76, 4.28, 10.24, 3.53, 7.21, 7.74, 15.44]
    got = linkfit.fit(n, [(b, t / 1e3) for b, t in zip(linkfit.sizes(LENET_BYTES), ms)])
    assert got["bandwidth_bps"] is None and "too small to show the link" in got["reason"], got
    # Every size at the latency: nothing on the wire.
    flat = [(b, lat) for b in linkfit.sizes(LENET_BYTES)]
    assert linkfit.fit(n, flat)["bandwidth_bps"] is None
