"""Figure sweep_wall_time: runs as one main_sweep.py job over the same runs one after the other.

Both sides train the same runs (seeds, the trainer runs' other settings) under
`horovodrun -np 2 --mpi`: the sweep as one job, each run on one of the two processes; the
other side as jobs in turn, each run on both processes. Two cases: two runs (`--sweep
seed=0,1`, a group per run: the headline), and four runs queued on the two groups (`--sweep
seed=0,1,2,3 --ranks-per-run 1`: `queued`). Timed: the wall time of the launcher processes,
start-up included, as a user waits for it. Each figure is the sweep's time over the jobs' time:
below 1, the sweep finishes them sooner.
"""
import os
import shlex
import shutil
import subprocess
import time

from benchmarks import harness, trainer_runs

NAME = "sweep_wall_time"
GOAL = ("<=", 0.9)
AGREE = 0.10
DESCRIPTION = "2 (and 4 queued) runs as one --sweep job at np=2 over the runs in turn at np=2, wall time"
FULL = dict(trainer_runs.FULL, sweep_repeats=3)
QUICK = dict(trainer_runs.QUICK, sweep_repeats=1)
SIDE_NAMES = {"sweep": "one --sweep job (a process per run)", "turns": "two jobs in turn (both processes per run)",
              "queued": "one --sweep job, 4 runs queued on 2 single-process groups",
              "turns4": "four jobs in turn (both processes per run)"}


def timed(cmd, ckpt):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=harness.ROOT, env=trainer_runs.env(), capture_output=True, text=True,
                       timeout=900, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"run failed ({r.returncode}): {shlex.join(cmd)}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    shutil.rmtree(ckpt, ignore_errors=True)
    return wall


def run(cfg, ctx):
    runs = trainer_runs.shared(cfg, ctx)
    sides, ratios, queued, commands = {name: [] for name in SIDE_NAMES}, [], [], {}
    cases = {"sweep": ("turns", ["seed=0,1"]), "queued": ("turns4", ["seed=0,1,2,3", "--ranks-per-run", "1"])}
    for r, order in enumerate(harness.alternating(list(SIDE_NAMES), cfg["sweep_repeats"])):
        wall = {}
        for side in order:
            ckpt = os.path.join(ctx.scratch, f"sweep-{r}-{side}")
            if side in cases:
                cmd = runs.command("hvd2-mpi", ckpt, flags=["--sweep", *cases[side][1]])
                wall[side] = timed(cmd, ckpt)
                commands[SIDE_NAMES[side]] = trainer_runs.shown(cmd, ctx.scratch)
            else:
                seeds = range(2 if side == "turns" else 4)
                cmds = [runs.command("hvd2-mpi", f"{ckpt}-{s}", flags=["--seed", str(s)]) for s in seeds]
                wall[side] = sum(timed(c, f"{ckpt}-{s}") for s, c in zip(seeds, cmds))
                commands[SIDE_NAMES[side]] = trainer_runs.shown(cmds[0], ctx.scratch)
            sides[side].append(wall[side])
        ratios.append(wall["sweep"] / wall["turns"])
        queued.append(wall["queued"] / wall["turns4"])
        harness.log(f"sweep repeat {r + 1}/{cfg['sweep_repeats']}: sweep {wall['sweep']:.1f}s, "
                    f"in turn {wall['turns']:.1f}s, ratio {ratios[-1]:.3f}; queued {wall['queued']:.1f}s, "
                    f"in turn {wall['turns4']:.1f}s, ratio {queued[-1]:.3f}")
    return {"value": harness.median(ratios), "repeats": ratios,
            "ratio_of_medians": harness.median(sides["sweep"]) / harness.median(sides["turns"]),
            "queued_value": harness.median(queued), "queued_repeats": queued,
            "sides": harness.side_medians(sides, "wall_s", SIDE_NAMES),
            "setup": {"timed": "wall time of the launcher processes, start-up and every epoch included",
                      "order": "per repeat the four sides, reversed in every other repeat",
                      "commands": commands}}


def markdown(fig):
    L = [f"Timed: {fig['setup']['timed']}. Order: {fig['setup']['order']}.", ""]
    if "queued_value" in fig:
        reps = ", ".join(f"{x:.3f}" for x in fig["queued_repeats"])
        L += [f"Queued: four runs on two single-process groups took {fig['queued_value']:.3f}x the wall "
              f"time of the four in turn (median; repeats {reps}).", ""]
    commands = {k: [a for a in c if a != "(then --seed 1)"] for k, c in fig["setup"]["commands"].items()}
    L += harness.command_lines(commands, {SIDE_NAMES["turns"]: "then the same with --seed 1",
                                          SIDE_NAMES["turns4"]: "then the same with --seed 1, 2 and 3"})
    L += harness.sides_table(fig["sides"], "wall_s", "wall seconds", ".1f")
    return L
