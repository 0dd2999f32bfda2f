"""Figure search_wall_time_vs_grid: an Optuna search with pruning (main_sweep.py --search) over a
grid of the same number of runs (main_sweep.py --sweep), wall time, both in one run.

The grid is 12 points, lr x weight decay (0.01, 0.03, 0.1, 0.3 x 5e-5, 5e-4, 5e-3); the search
has the same budget, 12 trials over the same ranges drawn log-uniformly (TPE, the median pruner,
seed 0). Every run has 5 epochs. LeNet trains on real CIFAR-10 (a class-balanced subset of the
JPEG copy beside the clone, ../shared/data/make_cifar10.py) on the CPU, the default recipe (batch
128, cosine over the epochs), under `horovodrun -np 2 --mpi` with a single-process group per run
(--ranks-per-run 1), one core each. Timed: the wall time of the launcher process, start-up and
every epoch included, as a user waits for it. The value is the search's time over the grid's:
below 1, the search ends sooner. The same measurement gives search_best_acc_minus_grid (its own
module): the best final test accuracy of the search's completed trials minus the grid's best
run's. Both come from `measured`, made once per benchmark run and shared through the run's
Context.
"""
import csv
import os
import shlex
import shutil
import subprocess
import sys
import time

from benchmarks import harness, trainer_runs
from benchmarks.trainer import real_data_accuracy

NAME = "search_wall_time_vs_grid"
GOAL = ("<=", 1.0)
DESCRIPTION = ("12-trial Optuna search with pruning over a 12-point lr x weight-decay grid, LeNet on "
               "real CIFAR-10, np=2: wall time")
# A subset of 20,000 training images: an epoch of LeNet takes about 6 s on one core, so the two
# jobs take minutes, not the hour the whole set would.
FULL = dict(search_subset=(20000, 4000), search_epochs=5, search_repeats=1,
            search_lr=(0.01, 0.03, 0.1, 0.3), search_wd=(5e-5, 5e-4, 5e-3))
QUICK = dict(search_subset=(500, 100), search_epochs=1, search_repeats=1,
             search_lr=(0.03, 0.1), search_wd=(5e-4, 5e-3))
SIDE_NAMES = {"grid": "grid (--sweep)", "search": "search (--search, median pruner)"}


def command(side, cfg, data_dir, ckpt):
    """The job of one side: main_sweep.py under horovodrun -np 2 --mpi, a process per run."""
    lr, wd = cfg["search_lr"], cfg["search_wd"]
    flags = ["--arch", "lenet", "--data-dir", data_dir, "--epochs", str(cfg["search_epochs"]), "--seed", "0",
             "--checkpoint-dir", ckpt, "--log-interval", "100000", "--ranks-per-run", "1"]
    if side == "grid":
        flags += ["--sweep", "lr=" + ",".join(map(str, lr)), "--sweep", "weight-decay=" + ",".join(map(str, wd))]
    else:
        flags += ["--search", f"lr=log:{min(lr)}:{max(lr)}", "--search", f"weight-decay=log:{min(wd)}:{max(wd)}",
                  "--trials", str(len(lr) * len(wd)), "--pruner", "median", "--sampler", "tpe"]
    return [os.path.join(os.path.dirname(sys.executable), "horovodrun"), "-np", "2", "--mpi", sys.executable,
            "main_sweep.py", *flags]


def outcome(side, ckpt):
    """A side's runs from its summary: the best final test accuracy, the run that gave it, the
    epochs trained over all runs, and the runs by how they ended."""
    with open(os.path.join(ckpt, "sweep.csv" if side == "grid" else "search.csv")) as f:
        rows = list(csv.DictReader(f))
    if side == "grid":
        done = [r for r in rows if r["status"] == "finished"]
        best = max(done, key=lambda r: float(r["final_test_acc"]))
        states = {"finished": len(done), "failed": len(rows) - len(done)}
        return {"best_acc": float(best["final_test_acc"]), "best": best["run"], "states": states,
                "epochs_trained": sum(int(r["epochs"] or 0) for r in rows)}
    done = [r for r in rows if r["state"] == "complete"]
    best = max(done, key=lambda r: float(r["value"]))
    states = {s: sum(r["state"] == s for r in rows) for s in ("complete", "pruned", "failed")}
    values = f"lr {float(best['lr']):.4g}, weight decay {float(best['weight-decay']):.3g}"
    return {"best_acc": float(best["value"]), "states": states, "best": f"trial {best['trial']}: {values}",
            "epochs_trained": sum(int(r["epochs"]) for r in rows)}


def measure(cfg, ctx):
    """Both sides, alternating (grid, search; then search, grid), each job timed whole."""
    subset = tuple(cfg["search_subset"])
    data_dir = ctx.shared(("real-cifar10", subset), lambda: real_data_accuracy.real_data(ctx.scratch, subset))
    sides, outcomes, commands = {s: [] for s in SIDE_NAMES}, {s: [] for s in SIDE_NAMES}, {}
    for r, order in enumerate(harness.alternating(list(SIDE_NAMES), cfg["search_repeats"])):
        for side in order:
            ckpt = os.path.join(ctx.scratch, f"search-{r}-{side}")
            cmd = command(side, cfg, data_dir, ckpt)
            t0 = time.perf_counter()
            done = subprocess.run(cmd, cwd=harness.ROOT, env=trainer_runs.env(), capture_output=True, text=True,
                                  timeout=7200, stdin=subprocess.DEVNULL)
            wall = time.perf_counter() - t0
            # A grid with a failed run (a diverging LR) exits 1 and still says what its others reached.
            summary = os.path.join(ckpt, "sweep.csv" if side == "grid" else "search.csv")
            if done.returncode not in (0, 1) or not os.path.exists(summary):
                raise RuntimeError(f"{side} failed ({done.returncode}): {shlex.join(cmd)}\n{done.stderr[-3000:]}")
            sides[side].append(wall)
            outcomes[side].append(outcome(side, ckpt))
            commands[SIDE_NAMES[side]] = trainer_runs.shown(cmd, ctx.scratch)
            shutil.rmtree(ckpt, ignore_errors=True)
            harness.log(f"search vs grid, repeat {r + 1}: {side} {wall:.0f} s, best test acc "
                        f"{outcomes[side][-1]['best_acc']:.4f}, {outcomes[side][-1]['epochs_trained']} epochs trained")
    return {"wall": sides, "outcomes": outcomes, "commands": commands,
            "data": f"real CIFAR-10 (JPEG copy), a class-balanced subset of {subset[0]} training and {subset[1]} "
                    "test images"}


def measured(cfg, ctx):
    """The one measurement of this benchmark run, for both figures; None where the pack is missing."""
    if not os.path.isfile(real_data_accuracy.MAKER):
        return None
    key = ("search_vs_grid",) + tuple(tuple(v) if isinstance(v, (list, tuple)) else v for v in cfg.values())
    return ctx.shared(key, lambda: measure(cfg, ctx))


def setup(cfg, m):
    return {"timed": "wall time of the launcher process, start-up and every epoch included",
            "order": "grid then search, reversed in every other repeat", "data": m["data"],
            "epochs": cfg["search_epochs"], "runs": len(cfg["search_lr"]) * len(cfg["search_wd"]),
            "commands": m["commands"]}


def run(cfg, ctx):
    m = measured(cfg, ctx)
    if m is None:
        return {"value": None, "skipped": f"real CIFAR-10 needs {os.path.normpath(real_data_accuracy.MAKER)}"}
    ratios = [s / g for s, g in zip(m["wall"]["search"], m["wall"]["grid"])]
    return {"value": harness.median(ratios), "repeats": ratios,
            "ratio_of_medians": harness.median(m["wall"]["search"]) / harness.median(m["wall"]["grid"]),
            "sides": harness.side_medians(m["wall"], "wall_s", SIDE_NAMES),
            "outcomes": {SIDE_NAMES[s]: o for s, o in m["outcomes"].items()}, "setup": setup(cfg, m)}


def outcome_lines(fig):
    """Each side's runs per repeat: epochs trained, how they ended, the best and its accuracy."""
    L = ["| side | repeat | epochs trained | runs | best final test acc | best run |", "|---|---|---|---|---|---|"]
    for side, outs in fig["outcomes"].items():
        for r, o in enumerate(outs, 1):
            states = ", ".join(f"{n} {s}" for s, n in o["states"].items() if n)
            L.append(f"| {side} | {r} | {o['epochs_trained']} | {states} | {o['best_acc']:.4f} | {o['best']} |")
    return L + [""]


def markdown(fig):
    s = fig["setup"]
    L = [f"Data: {s['data']}. {s['runs']} runs of {s['epochs']} epochs a side, LeNet, one process a run on the "
         f"CPU. Timed: {s['timed']}. Order: {s['order']}.", ""]
    L += harness.command_lines(s["commands"])
    L += harness.sides_table(fig["sides"], "wall_s", "wall seconds", ".0f")
    L += outcome_lines(fig)
    return L
