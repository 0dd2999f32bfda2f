"""What a finished sweep (main_sweep.py) reports, written by world rank 0 into CHECKPOINT_DIR:

- sweep.csv: one row per run (its values, status, epochs, final and best test accuracy,
  training time, the world ranks of the group that trained it), in the order of the --sweep
  lists, written atomically;
- the table on stdout: the final test accuracy per setting (the runs that differ only in their
  seed), mean ± std over its seeds, best first, then the folder of the best run;
- sweep.png: each run's test-accuracy curve over its epochs (from its metrics.csv), coloured by
  setting, and beside them each setting's final accuracy with its spread over seeds.
"""
import os
import statistics

from training.base import safeio
from training.run import runlog

COLUMNS = ("run", "status", "epochs", "final_test_acc", "best_test_acc", "train_time_s", "ranks")


def summary(history):
    """A finished run's figures, from its metric rows."""
    if not history:
        return {"epochs": 0}
    return {"epochs": history[-1]["epoch"], "final_test_acc": history[-1]["test_acc"],
            "best_test_acc": max(r["test_acc"] for r in history),
            "train_time_s": history[-1].get("train_time_s")}


def write(folder, flags, rows):
    """sweep.csv, the table on stdout, and sweep.png, for the runs' outcome `rows`."""
    os.makedirs(folder, exist_ok=True)
    columns = ["run", *flags, *COLUMNS[1:]]
    safeio.atomic_write_csv(os.path.join(folder, "sweep.csv"), columns, rows)
    settings = by_setting(flags, rows)
    print(table(settings, folder), flush=True)
    curves = {r["run"]: curve(folder, r["run"]) for r in rows}
    plot(os.path.join(folder, "sweep.png"), settings, curves)


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


def table(settings, folder):
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


def curve(folder, run):
    """(epochs, test accuracies) from a run's metrics.csv; empty where it has none."""
    rows = runlog.read_metrics(os.path.join(folder, run))
    return [int(r["epoch"]) for r in rows], [float(r["test_acc"]) for r in rows]


def plot(path, settings, curves):
    """sweep.png: on the left each run's test accuracy by epoch, a colour per setting; on the
    right each setting's final accuracy, mean with one std over its seeds as the error bar."""
    from matplotlib.figure import Figure  # a bare Figure: no pyplot state, as runlog's curves
    from matplotlib.ticker import MaxNLocator
    fig = Figure(figsize=(10, 4))
    left, right = fig.subplots(1, 2, width_ratios=(3, 2))
    for i, (s, accs, rs) in enumerate(settings):
        color = f"C{i % 10}"
        for j, r in enumerate(rs):
            epochs, acc = curves.get(r["run"], ([], []))
            left.plot(epochs, acc, color=color, alpha=0.8, marker="." if len(epochs) < 20 else None,
                      label=s if j == 0 else None)
        if accs:
            spread = statistics.stdev(accs) if len(accs) > 1 else 0
            right.errorbar(i, statistics.mean(accs), yerr=spread, fmt="o", capsize=4, color=color)
            right.plot([i + 0.15] * len(accs), accs, "x", color=color, alpha=0.5)  # each seed's
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.set_xlim(-0.5, len(settings) - 0.5)
    left.set(xlabel="epoch", ylabel="test accuracy", title="each run")
    left.legend(fontsize="small", loc="lower right")
    right.set_xticks(range(len(settings)), [s for s, _, _ in settings], rotation=30, ha="right")
    right.set(ylabel="final test accuracy", title="by setting: mean ± std over seeds, x each")
    fig.tight_layout()
    safeio.atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=80))
