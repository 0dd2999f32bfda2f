"""Figure mlflow_overhead_per_epoch: what --mlflow costs an epoch, as a fraction of it.

main.py trains LeNet on the trainer runs' synthetic data (trainer_runs: 5000 images, batch 64)
with and without `--mlflow` to a real `mlflow server` on 127.0.0.1 (a SQLite store in the scratch
folder), each for a few epochs and for many, the sides alternating (ABBA), after an untimed run
of each. Timed: the wall time
of the process, as a user waits for it. An epoch's wall time is the slope between the short
run and the long one, which leaves out what a run pays once (starting Python and torch, the
data, for --mlflow importing MLflow and making its run); the figure is the slope with --mlflow
over the slope without, less 1, per repeat: the share of an epoch that logging its row costs.
The one-off cost of --mlflow (what the intercepts differ by, in seconds) is recorded beside it.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from benchmarks import harness, trainer_runs

NAME = "mlflow_overhead_per_epoch"
GOAL = ("<=", 0.01)
DESCRIPTION = "--mlflow's cost per epoch over an epoch's wall time (LeNet, CPU, a local MLflow server)"
FULL = dict(trainer_runs.FULL, short_epochs=2, long_epochs=12, mlflow_repeats=5)
QUICK = dict(trainer_runs.QUICK, short_epochs=1, long_epochs=2, mlflow_repeats=1)


class Server:
    """`mlflow server` on a free port of 127.0.0.1, its store in `folder`, ended by its group."""

    def __init__(self, folder):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.uri = f"http://127.0.0.1:{port}"
        mlflow = os.path.join(os.path.dirname(sys.executable), "mlflow")
        self.log = open(os.path.join(folder, "mlflow-server.log"), "w")
        self.proc = subprocess.Popen([mlflow, "server", "--host", "127.0.0.1", "--port", str(port),
                                      "--backend-store-uri", f"sqlite:///{folder}/mlflow.db",
                                      "--artifacts-destination", os.path.join(folder, "artifacts"),
                                      "--workers", "1"], cwd=folder, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server did not start (see {self.log.name})")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


def timed(runs, ckpt, flags):
    cmd = runs.command("main", ckpt, flags=flags)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=harness.ROOT, env=trainer_runs.env(), capture_output=True, text=True,
                       timeout=900, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"run failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-3000:]}")
    shutil.rmtree(ckpt, ignore_errors=True)
    return wall, trainer_runs.shown(cmd, runs.scratch)


def run(cfg, ctx):
    try:
        import mlflow  # noqa: F401
    except ImportError:
        return {"value": None, "skipped": "MLflow is not installed (make setup installs it)"}
    runs = trainer_runs.shared(cfg, ctx)
    folder = os.path.join(ctx.scratch, "mlflow")
    os.makedirs(folder, exist_ok=True)
    server = Server(folder)
    short, long_ = cfg["short_epochs"], cfg["long_epochs"]
    sides = {"plain": [], "mlflow": []}
    ratios, once, commands = [], [], {}
    try:
        # Untimed, a run of each side first: the first runs of a session read their files cold.
        for side in sides:
            timed(runs, os.path.join(ctx.scratch, f"mlflow-warm-{side}"),
                  ["--epochs", str(short)] + (["--mlflow", server.uri] if side == "mlflow" else []))
        for r, order in enumerate(harness.alternating(list(sides), cfg["mlflow_repeats"])):
            slope, intercept = {}, {}
            for side in order:
                extra = ["--mlflow", server.uri] if side == "mlflow" else []
                walls = {}
                for epochs in (short, long_):
                    walls[epochs], cmd = timed(runs, os.path.join(ctx.scratch, f"mlflow-{r}-{side}-{epochs}"),
                                               [*extra, "--epochs", str(epochs)])
                    commands[side] = cmd
                slope[side] = (walls[long_] - walls[short]) / (long_ - short)
                intercept[side] = walls[short] - short * slope[side]
                sides[side].append({"walls_s": walls, "epoch_s": slope[side], "once_s": intercept[side]})
            ratios.append(slope["mlflow"] / slope["plain"] - 1)
            once.append(intercept["mlflow"] - intercept["plain"])
            harness.log(f"mlflow repeat {r}: an epoch {slope['plain']:.3f} s, with --mlflow {slope['mlflow']:.3f} s "
                        f"({ratios[-1]:+.4f}); once {once[-1]:+.2f} s")
    finally:
        server.stop()
    return {"value": harness.median(ratios), "repeats": ratios, "once_s": harness.median(once),
            "once_s_repeats": once, "sides": sides, "commands": commands,
            "setup": {"short_epochs": short, "long_epochs": long_, "images": cfg["train_size"],
                      "batch": cfg["train_batch"]}}


def markdown(fig):
    s = fig["setup"]
    epoch = harness.median([x["epoch_s"] for x in fig["sides"]["plain"]])
    return [f"main.py, LeNet, {s['images']} synthetic images at batch {s['batch']}, {s['short_epochs']} and "
            f"{s['long_epochs']} epochs with and without `--mlflow` to a local server: an epoch takes {epoch:.2f} s, "
            f"and --mlflow adds **{fig['value']:+.4f}** of it (median of " + ", ".join(f"{x:+.4f}" for x in
                                                                                     fig["repeats"])
            + f"; goal {GOAL[1]}). Once per run it adds {fig['once_s']:+.2f} s (importing MLflow, making the run, "
            "its artifacts at the end).", "",
            "Commands: " + "; ".join(f"`{' '.join(c)}`" for c in fig["commands"].values()), ""]
