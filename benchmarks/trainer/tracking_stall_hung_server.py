"""Figure tracking_stall_hung_server: how much a hung MLflow server slows training.

main.py trains LeNet on synthetic data of CIFAR-10's size with `--mlflow` to a real
`mlflow server` on 127.0.0.1. Once the run prints its third epoch, the server is frozen (SIGSTOP:
it accepts connections and never answers, as a hung server does) for the rest of the run, and
thawed after it. Each epoch's time is the wall time between the trainer's epoch lines,
so it holds whatever the run spends between epochs (the checkpoint, metrics.csv, and what the
tracker costs the training thread), not the epoch's own `epoch_time_s` alone. Per repeat, the
figure is the mean epoch time while the server hangs over the mean before it (the first epoch,
which starts the run, left out). Each request waits up to MLFLOW_HTTP_REQUEST_TIMEOUT (10 s): a
tracker that sent on the training path would add that to every epoch.
"""
import os
import re
import signal
import subprocess
import threading
import time

from benchmarks import harness, trainer_runs
from benchmarks.trainer.mlflow_overhead_per_epoch import Server

NAME = "tracking_stall_hung_server"
GOAL = ("<=", 1.1)
DESCRIPTION = ("mean epoch time while the MLflow server hangs (SIGSTOP) over the mean before it "
               "(LeNet, CPU, a local server)")
FULL = dict(trainer_runs.FULL, train_size=20000, stall_epochs=8, stall_repeats=3)
QUICK = dict(trainer_runs.QUICK, stall_epochs=4, stall_repeats=1)
EPOCH_LINE = re.compile(r"epoch \d+/\d+  lr ")  # an epoch's own line, not its progress lines


def epoch_times(cmd, env_extra, server, freeze_after):
    """Run `cmd`, freezing the server once epoch `freeze_after` is printed; (the wall times
    between epoch lines by epoch, the epoch the server froze after, the run's output)."""
    proc = subprocess.Popen(cmd, cwd=trainer_runs.ROOT, env=trainer_runs.env(env_extra),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL)
    seen, out, frozen = [], [], None
    timer = threading.Timer(900, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            out.append(line)
            if EPOCH_LINE.match(line):
                seen.append(time.monotonic())
                if frozen is None and len(seen) == freeze_after:
                    os.killpg(server.proc.pid, signal.SIGSTOP)
                    frozen = len(seen)
        proc.wait()
    finally:
        timer.cancel()
        os.killpg(server.proc.pid, signal.SIGCONT)
    if proc.returncode != 0:
        raise RuntimeError(f"run failed ({proc.returncode}): {' '.join(cmd)}\n{''.join(out)[-3000:]}")
    return [b - a for a, b in zip(seen, seen[1:])], frozen, "".join(out)


def run(cfg, ctx):
    try:
        import mlflow  # noqa: F401
    except ImportError:
        return {"value": None, "skipped": "MLflow is not installed (make setup installs it)"}
    runs = trainer_runs.shared(cfg, ctx)
    folder = os.path.join(ctx.scratch, "stall")
    os.makedirs(folder, exist_ok=True)
    freeze_after = 3  # the server hangs from the fourth epoch on
    env_extra = {"CIFAR_MLFLOW_WAIT_S": "2"}  # the run's end waits 2 s for the hung server
    ratios, sides, command = [], [], None
    for r in range(cfg["stall_repeats"]):
        server = Server(folder)
        try:
            ckpt = os.path.join(ctx.scratch, f"stall-{r}")
            cmd = runs.command("main", ckpt, flags=["--epochs", str(cfg["stall_epochs"]),
                                                    "--mlflow", server.uri])
            gaps, frozen, out = epoch_times(cmd, env_extra, server, freeze_after)
        finally:
            server.stop()
        before, during = gaps[:frozen - 1], gaps[frozen - 1:]
        if not before or not during or "not logged" not in out:  # the end met the hung server
            raise RuntimeError(f"the server did not hang mid-run: {out[-2000:]}")
        ratios.append((sum(during) / len(during)) / (sum(before) / len(before)))
        sides.append({"before_s": before, "hung_s": during})
        command = trainer_runs.shown(cmd, ctx.scratch)
        harness.log(f"stall repeat {r}: epochs {sum(before) / len(before):.2f} s before, "
                    f"{sum(during) / len(during):.2f} s while the server hangs ({ratios[-1]:.3f})")
    return {"value": harness.median(ratios), "repeats": ratios, "epochs": sides,
            "command": command, "setup": {"epochs": cfg["stall_epochs"], "images": cfg["train_size"],
                                          "batch": cfg["train_batch"], "hung_from_epoch": freeze_after + 1}}


def markdown(fig):
    s = fig["setup"]
    return [f"main.py, LeNet, {s['images']} synthetic images at batch {s['batch']}, {s['epochs']} epochs with "
            f"`--mlflow` to a local server, frozen (SIGSTOP) from epoch {s['hung_from_epoch']} to the end. Mean epoch "
            f"time while it hangs over the mean before: **{fig['value']:.3f}** (median of "
            + ", ".join(f"{x:.3f}" for x in fig["repeats"]) + f"; goal {GOAL[1]}). Below 1: the epochs before "
            "the hang share the process with the tracker's start (its thread importing MLflow, making the run); "
            "while the server hangs, that thread only waits.", "",
            f"Command: `{' '.join(fig['command'])}`", ""]
