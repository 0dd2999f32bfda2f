"""Figure horovod_np1_overhead: training time of main_horovod.py at np=1 over main.py.

Same flags, interleaved, timed as the sum of metrics.csv epoch_time_s after the
warm-up epochs. The headline runs both as a user would, unpinned (torch threads
= every usable core). On the CPU a second pair runs both confined to one core
(one torch thread), recorded beside the headline. Also recorded: what an idle
np=1 Horovod process costs (its background thread's CPU share and wake-ups).
"""
import json
import os
import subprocess
import sys

import torch

from benchmarks import harness, trainer_runs

NAME = "horovod_np1_overhead"
GOAL = ("<=", 1.02)
AGREE = 0.05  # the repeats' spread, (max - min) / median, beyond which the figure is inconclusive
DESCRIPTION = "main_horovod.py at np=1 over main.py, training time"
# 11 timed epochs of LeNet (about 5 s at np=1 on 2 cores): shorter windows measured the
# machine's noise more than Horovod's cost (repeats spread 15% over 3 epochs of about 1 s).
FULL = dict(trainer_runs.FULL, train_epochs=12, overhead_repeats=5, overhead_one_core=True)
QUICK = dict(trainer_runs.QUICK, overhead_repeats=1, overhead_one_core=False)
SIDE_NAMES = {"main": "main.py", "hvd": "main_horovod.py np=1",
              "main_pin": "main.py, one core", "hvd_pin": "main_horovod.py np=1, one core"}


def run(cfg, ctx):
    runs = trainer_runs.shared(cfg, ctx)
    repeats = cfg["overhead_repeats"]
    usable = sorted(os.sched_getaffinity(0))
    pinned = cfg["overhead_one_core"] and not torch.cuda.is_available() and len(usable) > 1
    kinds = ["main", "hvd"] + (["hvd_pin", "main_pin"] if pinned else [])
    pin = {usable[0]}
    sides = {k: [] for k in kinds}
    ratios, pin_ratios, example, record = [], [], {}, []
    # main hvd hvd_pin main_pin, then reversed
    for r, order in enumerate(harness.alternating(kinds, repeats)):
        res = {}
        for kind in order:
            res[kind] = runs.run(kind.split("_")[0], pin=pin if kind.endswith("_pin") else None)
            sides[kind].append(res[kind]["train_s"])
            example[kind] = res[kind]["command"]
            record.append(dict(res[kind], side=kind, repeat=r + 1))
        assert res["hvd"]["world_size"] == 1
        ratios.append(res["hvd"]["train_s"] / res["main"]["train_s"])
        msg = (f"overhead repeat {r + 1}/{repeats}: main {res['main']['train_s']:.2f}s, "
               f"horovod np=1 {res['hvd']['train_s']:.2f}s, ratio {ratios[-1]:.3f}")
        if pinned:
            pin_ratios.append(res["hvd_pin"]["train_s"] / res["main_pin"]["train_s"])
            msg += (f"; one core: main {res['main_pin']['train_s']:.2f}s, "
                    f"horovod {res['hvd_pin']['train_s']:.2f}s, ratio {pin_ratios[-1]:.3f}")
        harness.log(msg)
    out = {
        "value": harness.median(ratios), "repeats": ratios,
        "ratio_of_medians": harness.median(sides["hvd"]) / harness.median(sides["main"]),
        "sides": harness.side_medians(sides, "train_s", SIDE_NAMES),
        "runs": trainer_runs.without_commands(record),
        "horovod_idle": horovod_idle_cost(),
        "setup": {"timed": f"sum of metrics.csv epoch_time_s over epochs {cfg['skip_epochs'] + 1}.."
                           f"{cfg['train_epochs']} (the first {cfg['skip_epochs']} skipped as warm-up); "
                           "process start-up, evaluation and checkpoint writes not included",
                  "order": "per repeat " + " ".join(kinds) + ", reversed in every other repeat",
                  "commands": {SIDE_NAMES[k]: c for k, c in example.items()}},
    }
    if pinned:
        out["one_core"] = {"value": harness.median(pin_ratios), "repeats": pin_ratios,
                           "what": f"both confined to CPU {usable[0]} (1 torch thread each); "
                                   "not the headline"}
    return out


IDLE_PROBE = """
import json, os, resource, time
import horovod.torch as hvd
hvd.init()
time.sleep(0.5)
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
time.sleep(3)
r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
print(json.dumps({"cpu_fraction": (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / (t1 - t0),
                  "wakeups_per_s": (r1.ru_nvcsw - r0.ru_nvcsw) / (t1 - t0),
                  "controller": "mpi" if hvd.mpi_enabled() else "gloo", "size": hvd.size(),
                  "threads": len(os.listdir("/proc/self/task"))}))
"""


def horovod_idle_cost():
    """What an idle np=1 Horovod process costs: its background thread's CPU share and wake-ups."""
    r = subprocess.run([sys.executable, "-c", IDLE_PROBE], cwd=harness.ROOT, env=trainer_runs.env(),
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        return {"error": r.stderr.strip()[-500:]}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["what"] = ("plain python, hvd.init(), then 3 s asleep: CPU time and voluntary context "
                   "switches per second")
    return out


def markdown(fig):
    L = [f"Timed: {fig['setup']['timed']}. Fresh `--checkpoint-dir` per run; data generated beforehand.", ""]
    L += harness.command_lines(fig["setup"]["commands"])
    if "one_core" in fig:
        t = fig["one_core"]
        L += harness.beside_line(f"the ratio of the same pair {t['what'].split(';')[0]}", t)
    L += harness.sides_table(fig["sides"], "train_s", "training seconds", ".2f")
    idle = fig.get("horovod_idle", {})
    if "wakeups_per_s" in idle:
        L += [f"An idle np=1 Horovod process ({idle['what']}): {idle['wakeups_per_s']:.0f} wake-ups/s, "
              f"{100 * idle['cpu_fraction']:.1f}% of a core, {idle['threads']} threads, "
              f"{idle['controller']} controller.", ""]
    elif "error" in idle:
        L += [f"The idle Horovod probe failed: `{' '.join(idle['error'].split())[-300:]}`.", ""]
    return L
