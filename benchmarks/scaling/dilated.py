"""A step time free of the software cost that time dilation does not scale: the same emulated
job at D, 2D, 4D, ... (tools/emulate.py), its step read from where it stops falling."""


def mean_se(steps):
    """The mean of a point's timed steps and its standard error."""
    m = sum(steps) / len(steps)
    var = sum((x - m) ** 2 for x in steps) / (len(steps) - 1) if len(steps) > 1 else 0.0
    return m, (var / len(steps)) ** 0.5


def falls(a, b):
    """Whether the mean step of `a` exceeds that of `b` by more than twice their standard error."""
    (s1, e1), (s2, e2) = mean_se(a["steps_s"]), mean_se(b["steps_s"])
    return s1 - s2 > 2 * (e1 * e1 + e2 * e2) ** 0.5


def without_1_over_d(at_d, at_2d, *further):
    """One point from the same job at D and 2D and, where the step kept falling, at 4D, 8D, ...
    (`further`, each the next doubling). A software cost that does not dilate (gloo's messages,
    Python, between ranks sharing the cores) adds at most c/D to an emulated step. It can add
    less: Horovod's step is a whole number of its cycles, so a cost that fits the slack of the
    last cycle adds nothing, and one that outgrows it adds a cycle. As a function of 1/D the step
    is then flat near 0 and rises further out (convex), so the line through two dilations,
    extrapolated to 1/D = 0, falls at or below the true step (at it for a cost of exactly c/D),
    and the step at the larger D lies above it. Where no fall shows from D to 2D (more than twice
    their standard error), the step is the mean of all the timed steps. Where it falls: the mean
    of the steps at the first two dilations between which it stopped falling; if it still fell
    between the last two that ran, the middle of [2 step(last) - step(before), step(last)] (the
    bracket is kept); with only D and 2D, 2 step(2D) - step(D).
    Keeps every dilation's steps and c = D (step(D) - step), in real seconds."""
    runs = [at_d, at_2d, *further]
    means = [mean_se(r["steps_s"])[0] for r in runs]
    term = falls(at_d, at_2d)
    out = dict(at_d, step_s_at_d=means[0], one_over_d_term=term, cpu_share=max(r["cpu_share"] for r in runs))
    for i, (r, m) in enumerate(zip(runs[1:], means[1:])):
        out.update({f"step_s_at_{2 ** (i + 1)}d": m, f"steps_s_at_{2 ** (i + 1)}d": r["steps_s"]})
    pooled = lambda *ps: sum(sum(p["steps_s"]) for p in ps) / sum(len(p["steps_s"]) for p in ps)  # noqa: E731
    stopped = next((i for i in range(2, len(runs)) if not falls(runs[i - 1], runs[i])), None)
    bracket = None
    if not term:
        step = pooled(*runs)
    elif len(runs) == 2:
        step = 2 * means[1] - means[0]
    elif stopped is not None:
        step = pooled(runs[stopped - 1], runs[stopped])
    else:
        bracket = [2 * means[-1] - means[-2], means[-1]]
        step = sum(bracket) / 2
    software = at_d["dilation"] * (means[0] - step) if term else 0.0
    return dict(out, step_s=step, step_bracket_s=bracket, software_s=software)
