"""Runs of the real trainers, timed by the trainer itself: the one place a benchmark
or a check starts a trainer and reads its images/s from metrics.csv.

`run_trainer` runs one trainer command to its end; `TrainerRuns` is the CPU figures'
set of runs: main.py, main_horovod.py alone or under `horovodrun -np 2 --gloo`,
main_ddp.py alone or under `torchrun --nproc_per_node 2`, with the same flags (LeNet
on synthetic data unless the settings name another `arch`: LeNet is the only model
cheap enough for several repeats on 2 CPU cores), on data generated once beforehand,
each run in a fresh checkpoint folder. Its imports are the standard library's, so
scripts/gpu_check.py runs it from any python3 before the set-up.
"""
import csv
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time

# The benchmarks' figures take these from here, with the runs.
from testbed.env import MPI_ENV, ROOT, env, rank_pids, trainer_pids  # noqa: F401


def run_trainer(cmd, ckpt, env_extra=None, timeout=900, python=sys.executable):
    """Run a trainer command to its end, from the repository root: (its CompletedProcess,
    the rows of CHECKPOINT_DIR `ckpt`'s metrics.csv, [] where the run failed)."""
    r = subprocess.run(cmd, cwd=ROOT, env=env(env_extra, python), capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        return r, []
    with open(os.path.join(ckpt, "metrics.csv")) as f:
        return r, list(csv.DictReader(f))


def images_per_s(rows):
    """Training images per second over these epochs' rows: images over time, not a mean of rates."""
    seconds = sum(float(row["epoch_time_s"]) for row in rows)
    return sum(float(row["images_per_s"]) * float(row["epoch_time_s"]) for row in rows) / seconds


def shown(cmd, scratch=None):
    """A command as results show it: paths in the repository relative, the scratch folder named."""
    return [os.path.relpath(c, ROOT) if c.startswith(ROOT)
            else c.replace(scratch, "$SCRATCH") if scratch else c for c in cmd]

# The settings of the trainer runs, part of each timing figure's own FULL / QUICK.
FULL = dict(train_size=5000, train_batch=64, train_epochs=4, skip_epochs=1)
QUICK = dict(train_size=250, train_batch=64, train_epochs=2, skip_epochs=1)


def shared(cfg, ctx):
    """The run's one TrainerRuns for these settings: the data is generated once for every figure."""
    key = ("trainer_runs", cfg.get("arch", "lenet")) + tuple(cfg[k] for k in FULL)
    return ctx.shared(key, lambda: TrainerRuns(cfg, ctx.scratch))


def without_commands(record):
    """The runs as results.json keeps them: the commands are shown once per side instead."""
    return [{k: v for k, v in run.items() if k != "command"} for run in record]


class TrainerRuns:
    """Runs main.py / main_horovod.py on pre-generated synthetic data, fresh checkpoint dir each."""

    def __init__(self, cfg, scratch):
        from training.run import data  # the trainers' generator; torch only where figures run
        self.cfg, self.scratch = cfg, scratch
        self.data_dir = os.path.join(scratch, "trainer-data")
        self.count, self.lock = 0, threading.Lock()
        # Generated here, once, so that no timed run (and no rank) generates data.
        data.generate_synthetic(data.synthetic_folder(self.data_dir, cfg["train_size"], 0),
                                cfg["train_size"], cfg["train_size"] // 5, seed=0)
        self.bin = os.path.dirname(sys.executable)

    def flags(self, ckpt):
        c = self.cfg
        return ["--data-dir", self.data_dir, "--dataset", "synthetic",
                "--synthetic-size", str(c["train_size"]), "--seed", "0", "--arch", c.get("arch", "lenet"),
                "--epochs", str(c["train_epochs"]),
                "--batch-size", str(c["train_batch"]), "--lr", "0.05", "--checkpoint-dir", ckpt]

    def run(self, kind, pin=None, env_extra=None, flags=()):
        """kind: main | hvd | hvd-hooks | hvd2 | hvd2-mpi | hvd-normal | hvd2-normal | ddp | ddp2
        (-normal: benchmarks.diagnostics.normal_priority, Horovod's threads at normal priority;
        hvd-hooks: benchmarks.diagnostics.hooks_on, np=1 with the gradient hooks on). pin: CPUs the
        process is confined to (as taskset -c). env_extra: more environment (Horovod's knobs);
        flags: more trainer flags. Safe to call from two threads at once (see scaling_efficiency_np2's ceiling)."""
        with self.lock:
            self.count += 1
            ckpt = os.path.join(self.scratch, f"ckpt-{self.count:03d}-{kind}")
        cmd = self.command(kind, ckpt, pin, flags)
        t0 = time.perf_counter()
        r, rows = run_trainer(cmd, ckpt, env_extra)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            raise RuntimeError(f"trainer run failed ({r.returncode}): {shlex.join(cmd)}\n"
                               f"{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
        shutil.rmtree(ckpt, ignore_errors=True)
        timed = rows[self.cfg["skip_epochs"]:]
        return {"train_s": sum(float(row["epoch_time_s"]) for row in timed),
                "images_per_s": images_per_s(timed), "process_wall_s": wall,
                "epoch_time_s": [float(row["epoch_time_s"]) for row in rows],
                "world_size": int(rows[-1]["world_size"]), "load_1min_after": os.getloadavg()[0],
                "profile": profile_ms(r.stdout), "command": shown(cmd, self.scratch)}

    def command(self, kind, ckpt, pin=None, flags=()):
        """The command line of a run of `kind` writing to `ckpt` (see run)."""
        script = {"main": "main.py", "ddp": "main_ddp.py", "ddp2": "main_ddp.py"}.get(kind, "main_horovod.py")
        if "--sweep" in flags:  # many runs as one job: main_sweep.py, with main_horovod.py's flags
            script = "main_sweep.py"
        entry = (["-m", "benchmarks.diagnostics.normal_priority"] if kind.endswith("-normal") else
                 ["-m", "benchmarks.diagnostics.hooks_on"] if kind == "hvd-hooks" else [script])
        # main.py has no --warmup-epochs (it belongs to the ports); at np=1 the
        # warm-up is a no-op anyway (LR scale 1), and it is 0 for np=2 here too.
        extra = [] if kind == "main" else ["--warmup-epochs", "0"]
        cmd = [sys.executable, *entry, *self.flags(ckpt), *extra, *flags]
        if kind.startswith("hvd2"):
            controller = "--mpi" if kind == "hvd2-mpi" else "--gloo"
            cmd = [os.path.join(self.bin, "horovodrun"), "-np", "2", controller, *cmd]
        if kind == "ddp2":
            cmd = [os.path.join(self.bin, "torchrun"), "--standalone", "--nproc_per_node", "2", *cmd[1:]]
        if pin:  # taskset, not preexec_fn: runs come from two threads at once (preexec_fn is unsafe there)
            cmd = ["taskset", "-c", ",".join(map(str, sorted(pin))), *cmd]
        return cmd


def profile_ms(stdout):
    """--profile-steps' medians, {phase: ms per step}, from the line rank 0 prints; None without it."""
    m = re.search(r"^(?:\[0\]<stdout>:)?profile: median ms per step over \d+ steps: (.*)$", stdout, re.M)
    if not m:
        return None
    return {name: float(ms) for name, ms in re.findall(r"([a-z-]+) ([0-9.]+)", m.group(1))}
