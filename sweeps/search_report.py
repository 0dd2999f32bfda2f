"""What a search (main_sweep.py --search) reports at its end, written by world rank 0 into
CHECKPOINT_DIR from the study's trials and their metrics.csv:

- search.csv: one row per trial, by number: its state (complete, pruned, failed, running), its
  value (the final test accuracy; a pruned trial's at the epoch it ended), its values, the
  epochs it trained, best test accuracy, training time, folder, the world ranks of the group
  that trained it last, and why it failed; written atomically;
- the table on stdout: the best completed trials, best first, with their values and folders,
  the count of trials by state, the command that retrains the best trial alone, and the
  dashboard's;
- search.png: each trial's test accuracy by epoch, a pruned one dashed and cut with an x where
  it ended, a failed one dotted; beside them each trial's value against its number, and the
  best so far.

The trials are Optuna's FrozenTrial, read here by their attributes only.
"""
import os

from training.base import safeio
from training.run import runlog

BEST = 5  # completed trials in the table
STATES = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running",
          "WAITING": "waiting"}


def metrics(folder):
    """A trial's metrics.csv rows, [] where it has none (it failed in its first epoch)."""
    return runlog.read_metrics(folder)


def rows(trials, flags):
    """One row per trial, by number (search.csv's)."""
    out = []
    for t in sorted(trials, key=lambda t: t.number):
        folder = t.user_attrs.get("folder", "")
        m = metrics(folder) if folder else []
        out.append({"trial": t.number, "state": STATES.get(t.state.name, t.state.name.lower()),
                    "value": t.value if t.state.name in ("COMPLETE", "PRUNED") else None,
                    **{f: t.params.get(f) for f in flags},
                    "epochs": int(m[-1]["epoch"]) if m else 0,
                    "best_test_acc": max(float(r["test_acc"]) for r in m) if m else None,
                    "train_time_s": float(m[-1]["train_time_s"]) if m else None,
                    "folder": folder, "ranks": t.user_attrs.get("ranks", ""),
                    "reason": t.user_attrs.get("fail_reason", ""),
                    "curve": ([int(r["epoch"]) for r in m], [float(r["test_acc"]) for r in m])})
    return out


def write(folder, flags, trials, retrain, dashboard):
    """search.csv, the table on stdout, and search.png, for the study's `trials`; `retrain`,
    the command that trains the best trial alone, `dashboard`, the one that shows the study.
    Returns how many trials completed."""
    table_rows = rows(trials, flags)
    columns = ["trial", "state", "value", *flags, "epochs", "best_test_acc", "train_time_s",
               "folder", "ranks", "reason"]
    safeio.atomic_write_csv(os.path.join(folder, "search.csv"), columns, table_rows)
    print(table(table_rows, flags, folder, retrain, dashboard), flush=True)
    plot(os.path.join(folder, "search.png"), table_rows)
    return sum(r["state"] == "complete" for r in table_rows)


def shown(value):
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def table(table_rows, flags, folder, retrain, dashboard):
    """The end of a search: the best completed trials, best first, and how many ended how."""
    counts = {}
    for r in table_rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    lines = [f"study {os.path.join(folder, 'study.journal')}: {len(table_rows)} trials, "
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


def plot(path, table_rows):
    """search.png: on the left each trial's test accuracy by epoch (a pruned one dashed, with an
    x where it was cut; a failed one dotted), on the right each trial's value against its
    number and the best value so far."""
    from matplotlib.figure import Figure  # a bare Figure: no pyplot state, as runlog's curves
    from matplotlib.ticker import MaxNLocator
    fig = Figure(figsize=(11, 4.2))
    left, right = fig.subplots(1, 2)
    style = {"complete": "-", "pruned": "--", "failed": ":", "running": "-."}
    for r in table_rows:
        epochs, acc = r["curve"]
        if not epochs:
            continue
        color = f"C{r['trial'] % 10}"
        left.plot(epochs, acc, style.get(r["state"], "-"), color=color, alpha=0.8,
                  marker="." if len(epochs) < 20 else None, label=f"trial {r['trial']}")
        if r["state"] in ("pruned", "failed"):
            left.plot(epochs[-1], acc[-1], "x", color=color, markersize=9, mew=2)
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.set(xlabel="epoch", ylabel="test accuracy",
             title="each trial (pruned: dashed, cut at x; failed: dotted)")
    if left.lines and len(table_rows) <= 12:
        left.legend(fontsize="small", loc="lower right")
    best, so_far = None, []
    for r in table_rows:
        if r["state"] == "complete":
            best = r["value"] if best is None else max(best, r["value"])
        so_far.append(best)
    for state, marker in (("complete", "o"), ("pruned", "x")):
        picked = [r for r in table_rows if r["state"] == state]
        right.plot([r["trial"] for r in picked], [r["value"] for r in picked], marker,
                   linestyle="none", label=state, color="C0" if state == "complete" else "C3")
    right.step([r["trial"] for r in table_rows],
               [float("nan") if b is None else b for b in so_far], where="post", color="k",
               label="best so far")
    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.set(xlabel="trial", ylabel="test accuracy (a pruned trial's when cut)",
              title="value by trial, and the best so far")
    right.legend(fontsize="small", loc="lower right")
    fig.tight_layout()
    safeio.atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=80))
