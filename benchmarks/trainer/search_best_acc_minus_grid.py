"""Figure search_best_acc_minus_grid: the best final test accuracy of an Optuna search with
pruning minus that of a grid of the same number of runs, from search_wall_time_vs_grid's
measurement (the same jobs, made once per benchmark run; its docstring says what they are).

A side's best is its best run's test accuracy after the last epoch: the grid's best run, and the
search's best completed trial (a pruned trial never counts). The value is search minus grid, in
accuracy (a fraction of the test images): 0 or more, the search found at least as good a run.
"""
from benchmarks import harness
from benchmarks.trainer import search_wall_time_vs_grid as jobs

NAME = "search_best_acc_minus_grid"
GOAL = (">=", 0.0)
DESCRIPTION = "the same search's best final test accuracy minus the grid's"
FULL, QUICK = jobs.FULL, jobs.QUICK


def run(cfg, ctx):
    m = jobs.measured(cfg, ctx)
    if m is None:
        return {"value": None, "skipped": "real CIFAR-10 is missing (see search_wall_time_vs_grid)"}
    best = {side: [o["best_acc"] for o in outs] for side, outs in m["outcomes"].items()}
    diffs = [s - g for s, g in zip(best["search"], best["grid"])]
    return {"value": harness.median(diffs), "repeats": diffs,
            "sides": harness.side_medians(best, "best_test_acc", jobs.SIDE_NAMES),
            "outcomes": {jobs.SIDE_NAMES[s]: o for s, o in m["outcomes"].items()}, "setup": jobs.setup(cfg, m)}


def markdown(fig):
    L = [f"From the jobs of `search_wall_time_vs_grid` ({fig['setup']['data']}; commands there).", ""]
    L += harness.sides_table(fig["sides"], "best_test_acc", "best final test accuracy", ".4f")
    L += jobs.outcome_lines(fig)
    return L
