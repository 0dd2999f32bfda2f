"""What a finished sweep or search (main_sweep.py) reports, written by world rank 0 into
CHECKPOINT_DIR. Both read each run's metrics.csv (runlog.read_metrics) for its curve, write
their CSV atomically, print a table and draw an SVG (training/base/svgchart.py).

A grid (--sweep):
- sweep.csv: one row per run (its values, status, epochs, final and best test accuracy,
  training time, the world ranks of the group that trained it), in the order of the --sweep
  lists;
- the table on stdout: the final test accuracy per setting (the runs that differ only in their
  seed), mean ± std over its seeds, best first, then the folder of the best run;
- sweep.svg: each run's test-accuracy curve over its epochs, coloured by setting, and beside
  them each setting's final accuracy with its spread over seeds.

A study (--search), from its trials (Optuna's FrozenTrial, read by their attributes only):
- search.csv: one row per trial, by number: its state (complete, pruned, failed, running), its
  value (the final test accuracy; a pruned trial's at the epoch it ended), its values, the
  epochs it trained, best test accuracy, training time, folder, the world ranks of the group
  that trained it last, and why it failed;
- the table on stdout: the best completed trials, best first, with their values and folders,
  the count of trials by state, the command that retrains the best trial alone, and the
  dashboard's;
- search.svg: each trial's test accuracy by epoch, a pruned one dashed and cut with an x where
  it ended, a failed one dotted; beside them each trial's value against its number, and the
  best so far.
"""
import os
import statistics

from training.base import safeio, svgchart
from training.base.redact import redact
from training.run import runlog

COLUMNS = ("run", "status", "epochs", "final_test_acc", "best_test_acc", "train_time_s", "ranks")
BEST = 5  # completed trials in a study's table
STATES = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running",
          "WAITING": "waiting"}


def curve_of(rows):
    """(epochs, test accuracies) of a run's metric rows."""
    return [int(r["epoch"]) for r in rows], [float(r["test_acc"]) for r in rows]


def curve(folder):
    """(epochs, test accuracies) from the metrics.csv in `folder`; empty where it has none."""
    return curve_of(runlog.read_metrics(folder))


# A grid: sweep.csv, its table and sweep.svg.


def summary(history):
    """A finished run's figures, from its metric rows."""
    if not history:
        return {"epochs": 0}
    return {"epochs": history[-1]["epoch"], "final_test_acc": history[-1]["test_acc"],
            "best_test_acc": max(r["test_acc"] for r in history),
            "train_time_s": history[-1].get("train_time_s")}


def write_grid(folder, flags, rows):
    """sweep.csv, the table on stdout, and sweep.svg, for the runs' outcome `rows`."""
    os.makedirs(folder, exist_ok=True)
    columns = ["run", *flags, *COLUMNS[1:]]
    safeio.atomic_write_csv(os.path.join(folder, "sweep.csv"), columns, rows)
    settings = by_setting(flags, rows)
    print(grid_table(settings, folder), flush=True)
    curves = {r["run"]: curve(os.path.join(folder, r["run"])) for r in rows}
    plot_grid(os.path.join(folder, "sweep.svg"), settings, curves)


def by_setting(flags, rows):
    """[(setting, final accuracies of its finished runs, runs)], best mean first and settings
    without a finished run last: runs that differ only in their seed share a setting, so their
    spread is the error bar."""
    keep = [f for f in flags if f != "seed"]
    groups = {}
    for r in rows:
        setting = " ".join(f"{f}={r[f]}" for f in keep) or "all runs"
        groups.setdefault(setting, []).append(r)
    settings = [(s, [r["final_test_acc"] for r in rs if r["status"] == "finished"], rs)
                for s, rs in groups.items()]
    return sorted(settings, key=lambda s: -statistics.mean(s[1]) if s[1] else float("inf"))


def mean_std(accs):
    if not accs:
        return "failed"
    if len(accs) == 1:
        return f"{accs[0]:.4f}"
    return f"{statistics.mean(accs):.4f} ± {statistics.stdev(accs):.4f}"


def grid_table(settings, folder):
    """The end-of-sweep table: final test accuracy per setting, mean ± std over its seeds, best
    first; then the best run's folder."""
    width = max(len("setting"), *(len(s) for s, _, _ in settings))
    lines = [f"{'setting':<{width}}  runs  final test acc", f"{'-' * width}  ----  --------------"]
    for s, accs, rs in settings:
        failed = len(rs) - len(accs)
        lines.append(f"{s:<{width}}  {len(rs):>4}  {mean_std(accs)}"
                     + (f"  ({failed} failed)" if failed else ""))
    finished = [r for _, _, rs in settings for r in rs if r["status"] == "finished"]
    if finished:
        best = max(finished, key=lambda r: r["final_test_acc"])
        lines.append(f"best run: {os.path.join(folder, best['run'])} "
                     f"(final test acc {best['final_test_acc']:.4f})")
    return "\n".join(lines)


def plot_grid(path, settings, curves):
    """sweep.svg: on the left each run's test accuracy by epoch, a colour per setting; on the
    right each setting's final accuracy, mean with one std over its seeds as the error bar, and
    each seed's as an x beside it."""
    runs, means, seeds = [], [], []
    for i, (s, accs, rs) in enumerate(settings):
        color = svgchart.PALETTE[i % len(svgchart.PALETTE)]
        for j, r in enumerate(rs):
            epochs, acc = curves.get(r["run"], ([], []))
            runs.append({"points": list(zip(epochs, acc)), "color": color,
                         "label": s if j == 0 else None,
                         "marker": "dot" if len(epochs) < 20 else None})
        if accs:
            spread = statistics.stdev(accs) if len(accs) > 1 else 0.0
            means.append({"points": [(i, statistics.mean(accs))], "errors": [spread],
                          "color": color, "marker": "o", "line": False})
            seeds.append({"points": [(i + 0.15, a) for a in accs], "color": color, "marker": "x",
                          "line": False})
    svg = svgchart.page([("each run: test accuracy", "epoch", runs, None),
                         ("by setting: mean ± std over seeds, x each", "setting", means + seeds,
                          [s for s, _, _ in settings])], columns=2)
    safeio.atomic_write(path, lambda f: f.write(svg.encode()))


# A study: search.csv, its table and search.svg.


def rows(trials, flags):
    """One row per trial, by number (search.csv's)."""
    out = []
    for t in sorted(trials, key=lambda t: t.number):
        folder = t.user_attrs.get("folder", "")
        m = runlog.read_metrics(folder) if folder else []
        out.append({"trial": t.number, "state": STATES.get(t.state.name, t.state.name.lower()),
                    "value": t.value if t.state.name in ("COMPLETE", "PRUNED") else None,
                    **{f: t.params.get(f) for f in flags},
                    "epochs": int(m[-1]["epoch"]) if m else 0,
                    "best_test_acc": max(float(r["test_acc"]) for r in m) if m else None,
                    "train_time_s": float(m[-1]["train_time_s"]) if m else None,
                    "folder": folder, "ranks": t.user_attrs.get("ranks", ""),
                    "reason": t.user_attrs.get("fail_reason", ""),
                    "curve": curve_of(m)})
    return out


def write_study(folder, flags, trials, retrain, dashboard, where=None):
    """search.csv, the table on stdout, and search.svg, for the study's `trials` (kept at
    `where`, by default CHECKPOINT_DIR/study.journal); `retrain`, the command that trains the
    best trial alone, `dashboard`, the one that shows the study. Returns how many trials
    completed."""
    table_rows = rows(trials, flags)
    columns = ["trial", "state", "value", *flags, "epochs", "best_test_acc", "train_time_s",
               "folder", "ranks", "reason"]
    safeio.atomic_write_csv(os.path.join(folder, "search.csv"), columns, table_rows)
    where = where or os.path.join(folder, "study.journal")
    print(redact(study_table(table_rows, flags, where, retrain, dashboard)), flush=True)
    plot_study(os.path.join(folder, "search.svg"), table_rows)
    return sum(r["state"] == "complete" for r in table_rows)


def shown(value):
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def study_table(table_rows, flags, where, retrain, dashboard):
    """The end of a search: the best completed trials, best first, and how many ended how."""
    counts = {}
    for r in table_rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    lines = [f"study {where}: {len(table_rows)} trials, "
             + ", ".join(f"{n} {state}" for state, n in counts.items())]
    best = sorted((r for r in table_rows if r["state"] == "complete"), key=lambda r: -r["value"])
    if not best:
        return "\n".join(lines + ["no trial completed"])
    head = ["trial", "test acc", *flags, "folder"]
    cells = [[str(r["trial"]), f"{r['value']:.4f}", *(shown(r[f]) for f in flags), r["folder"]]
             for r in best[:BEST]]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    lines.append(f"the best completed trials ({len(cells)} of {len(best)}), final test acc:")
    for row in [head, ["-" * w for w in widths], *cells]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    lines.append(f"retrain the best trial ({best[0]['trial']}) alone: {retrain}")
    lines.append(f"watch the study: {dashboard}")
    return "\n".join(lines)


def plot_study(path, table_rows):
    """search.svg: on the left each trial's test accuracy by epoch (a pruned one dashed, with an
    x where it was cut; a failed one dotted), on the right each trial's value against its
    number and the best value so far."""
    dash = {"pruned": "dashed", "failed": "dotted", "running": "dashdot"}
    trials = []
    for r in table_rows:
        epochs, acc = r["curve"]
        if not epochs:
            continue
        color = svgchart.PALETTE[r["trial"] % len(svgchart.PALETTE)]
        trials.append({"points": list(zip(epochs, acc)), "color": color,
                       "dash": dash.get(r["state"]),
                       "label": f"trial {r['trial']}" if len(table_rows) <= 8 else None,
                       "marker": "dot" if len(epochs) < 20 else None})
        if r["state"] in ("pruned", "failed"):
            trials.append({"points": [(epochs[-1], acc[-1])], "color": color, "marker": "x",
                           "line": False})
    best, so_far = None, []
    for r in table_rows:
        if r["state"] == "complete":
            best = r["value"] if best is None else max(best, r["value"])
        so_far.append((r["trial"], best))
    values = [{"points": [(r["trial"], r["value"]) for r in table_rows if r["state"] == state],
               "color": color, "marker": marker, "line": False, "label": state}
              for state, marker, color in (("complete", "o", svgchart.PALETTE[0]),
                                           ("pruned", "x", svgchart.PALETTE[3]))]
    values.append({"points": so_far, "color": "#000", "steps": True, "label": "best so far"})
    svg = svgchart.page([("each trial (pruned: dashed, cut at x; failed: dotted)", "epoch", trials,
                          None),
                         ("value by trial, and the best so far", "trial", values, None)], columns=2)
    safeio.atomic_write(path, lambda f: f.write(svg.encode()))
