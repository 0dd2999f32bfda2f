"""Figure mlflow_overhead_per_epoch: what --mlflow costs an epoch, as a fraction of it.

main.py trains LeNet on synthetic data of CIFAR-10's size (50,000 images, batch 64)
with and without `--mlflow` to a real `mlflow server` on 127.0.0.1 (a SQLite store in the scratch
folder), the sides alternating (ABBA) after an untimed run of each. Per repeat, the figure is
the time the run's training thread spent logging an epoch (its own account, the line `mlflow: N
epochs logged, X ms an epoch`: the row handed to the thread that sends it, once its checkpoint
is saved) over the epoch's time in metrics.csv. What the sending thread costs the epochs beside
it is tracking_stall_hung_server's "before" side. Beside it, the two sides' process wall times: their difference is
mostly what --mlflow costs once a run (importing MLflow, making the run, its artifacts at the
end); at this epoch length, the process wall time varies by more than the per-epoch cost.
"""
import os
import re
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
DESCRIPTION = ("--mlflow's logging time on the training thread per epoch over the epoch's time (LeNet, CPU, a "
               "local MLflow server)")
# An epoch of CIFAR-10's size (50,000 images), as a LeNet run on the CPU has it.
FULL = dict(trainer_runs.FULL, train_size=50000, mlflow_epochs=4, mlflow_repeats=3)
QUICK = dict(trainer_runs.QUICK, mlflow_epochs=2, mlflow_repeats=1)
LINE = re.compile(r"^mlflow: (\d+) epochs logged, ([0-9.]+) ms an epoch$", re.M)


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
    """(process wall time, the run's metrics rows, its output, the command shown)."""
    cmd = runs.command("main", ckpt, flags=flags)
    t0 = time.perf_counter()
    r, rows = trainer_runs.run_trainer(cmd, ckpt)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"run failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-3000:]}")
    shutil.rmtree(ckpt, ignore_errors=True)
    return wall, rows, r.stdout, trainer_runs.shown(cmd, runs.scratch)


def run(cfg, ctx):
    try:
        import mlflow  # noqa: F401
    except ImportError:
        return {"value": None, "skipped": "MLflow is not installed (make setup installs it)"}
    runs = trainer_runs.shared(cfg, ctx)
    folder = os.path.join(ctx.scratch, "mlflow")
    os.makedirs(folder, exist_ok=True)
    server = Server(folder)
    flags = {"plain": ["--epochs", str(cfg["mlflow_epochs"])],
             "mlflow": ["--epochs", str(cfg["mlflow_epochs"]), "--mlflow", server.uri]}
    sides, ratios, commands = {"plain": [], "mlflow": []}, [], {}
    try:
        for side in sides:  # untimed: the first runs of a session read their files cold
            timed(runs, os.path.join(ctx.scratch, f"mlflow-warm-{side}"), flags[side])
        for r, order in enumerate(harness.alternating(list(sides), cfg["mlflow_repeats"])):
            for side in order:
                wall, rows, out, commands[side] = timed(runs, os.path.join(ctx.scratch, f"mlflow-{r}-{side}"),
                                                        flags[side])
                epoch_s = sum(float(row["epoch_time_s"]) for row in rows) / len(rows)
                got = {"wall_s": wall, "epoch_s": epoch_s}
                if side == "mlflow":
                    m = LINE.search(out)
                    if not m:
                        raise RuntimeError(f"no 'mlflow: N epochs logged' line in the run's output:\n{out[-2000:]}")
                    got["log_s"] = float(m.group(2)) / 1e3
                    ratios.append(got["log_s"] / epoch_s)
                sides[side].append(got)
            harness.log(f"mlflow repeat {r}: logging {sides['mlflow'][-1]['log_s'] * 1e3:.1f} ms of a "
                        f"{sides['mlflow'][-1]['epoch_s']:.2f} s epoch ({ratios[-1]:.4f}); walls "
                        f"{sides['plain'][-1]['wall_s']:.1f} s and {sides['mlflow'][-1]['wall_s']:.1f} s")
    finally:
        server.stop()
    once = [m["wall_s"] - p["wall_s"] for p, m in zip(sides["plain"], sides["mlflow"])]
    return {"value": harness.median(ratios), "repeats": ratios, "wall_difference_s": harness.median(once),
            "wall_difference_s_repeats": once, "sides": sides, "commands": commands,
            "setup": {"epochs": cfg["mlflow_epochs"], "images": cfg["train_size"], "batch": cfg["train_batch"]}}


def markdown(fig):
    s, m = fig["setup"], fig["sides"]["mlflow"]
    log_ms = harness.median([x["log_s"] for x in m]) * 1e3
    epoch = harness.median([x["epoch_s"] for x in m])
    return [f"main.py, LeNet, {s['images']} synthetic images at batch {s['batch']}, {s['epochs']} epochs, with and "
            f"without `--mlflow` to a local server. Logging an epoch took the training thread {log_ms:.3f} ms of a "
            f"{epoch:.2f} s epoch: **{fig['value']:.2g}** of it (median of "
            + ", ".join(f"{x:.2g}" for x in fig["repeats"])
            + f"; goal {GOAL[1]}). The process with --mlflow took {fig['wall_difference_s']:+.1f} s longer "
            "(median of " + ", ".join(f"{x:+.1f}" for x in fig["wall_difference_s_repeats"]) + " s): MLflow's "
            "import, the run's making and its artifacts, once a run.", "",
            "Commands: " + "; ".join(f"`{' '.join(c)}`" for c in fig["commands"].values()), ""]
