"""Loop the ways a distributed run ends, under a CPU hog, and count aborts and hangs.

Not part of the suite (pytest collects only test_*.py): a stress check to run by hand,
for an hour or more. Each loop runs every chosen port through every chosen path:

  end       a run that trains to its last epoch
  stop-at   a run of 2 epochs that stops after epoch 1 (--stop-at 1)
  sigterm   SIGTERM to every process of a running job at a random moment of an epoch, as
            Slurm sends it on pre-emption (the launcher and every rank alike)
  evaluate  --evaluate of a checkpoint

Ports: ddp (torchrun --standalone main_ddp.py), horovod (horovodrun --gloo main_horovod.py),
mpirun (mpirun main_horovod.py), elastic (horovodrun's elastic driver, main_elastic.py).

A loop counts as an abort when any process of the job ended by SIGABRT or printed libstdc++'s
"terminate called", and as a hang when the job has not ended --timeout seconds after it should
(the job is then killed). Any other exit status than the path's clean one is counted under
"other", with its status. Every failing job's output is kept in --out.

  .venv/bin/python tests/stress_stops.py --ports ddp,horovod --loops 100 --np 3
"""
import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]  # the repository
from helpers import ABORTED, BIN, MPI_ENV, ROOT  # noqa: E402

PATHS = ("end", "stop-at", "sigterm", "evaluate")
PORTS = ("ddp", "horovod", "mpirun", "elastic")


def command(port, np_, trainer_args, workdir):
    if port == "ddp":
        return [os.path.join(BIN, "torchrun"), "--standalone", "--nproc_per_node", str(np_),
                "main_ddp.py", *trainer_args]
    if port == "horovod":
        return [os.path.join(BIN, "horovodrun"), "-np", str(np_), "--gloo", sys.executable,
                "main_horovod.py", *trainer_args]
    if port == "mpirun":
        return ["mpirun", "-np", str(np_), "--bind-to", "none", "-x", "PATH", "-x", "PYTHONUNBUFFERED",
                "-x", "PYTHONFAULTHANDLER", sys.executable, "main_horovod.py", *trainer_args]
    slots = os.path.join(workdir, "slots")
    with open(slots, "w") as f:
        f.write(f"{np_}\n")
    return [os.path.join(BIN, "horovodrun"), "-np", str(np_), "--min-np", "1", "--max-np", str(np_),
            "--host-discovery-script", f"{ROOT}/scripts/discover_hosts.sh {slots}",
            "--network-interface", "lo", sys.executable, "main_elastic.py", *trainer_args]


def trainer_args(data_dir, ckpt, *extra, epochs=2):
    return ["--data-dir", data_dir, "--dataset", "synthetic", "--synthetic-size", "500", "--arch", "lenet",
            "--batch-size", "32", "--lr", "0.05", "--epochs", str(epochs), "--checkpoint-dir", ckpt,
            *extra]


def clean_status(path):
    """The exit status a clean end of `path` gives. Each rank answers a stop signal with
    128 + 15, and every launcher here (torchrun, horovodrun, mpirun), signalled itself, ends
    with 1."""
    return 1 if path == "sigterm" else 0


def metrics_rows(ckpt):
    try:
        with open(os.path.join(ckpt, "metrics.csv")) as f:
            return max(sum(1 for _ in f) - 1, 0)
    except OSError:
        return 0


def run_job(cmd, env, timeout, signal_after_rows=None, ckpt=None):
    """(status or None when it hung, output). With signal_after_rows, SIGTERM goes to the whole
    job (its own session) at a random moment after the epoch's row appears."""
    with tempfile.TemporaryFile("w+") as out:
        job = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        if signal_after_rows is not None:
            while metrics_rows(ckpt) < signal_after_rows and job.poll() is None:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            time.sleep(random.uniform(0, 0.5))  # somewhere in the next epoch
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGTERM)
                deadline = time.monotonic() + timeout
        try:
            status = job.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            status = None
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        out.seek(0)
        return status, out.read()


def one(port, path, np_, data_dir, work, timeout, env):
    ckpt = os.path.join(work, "ck")
    shutil.rmtree(ckpt, ignore_errors=True)
    if path == "end":
        args = trainer_args(data_dir, ckpt, epochs=1)
    elif path == "stop-at":
        args = trainer_args(data_dir, ckpt, "--stop-at", "1")
    elif path == "sigterm":
        args = trainer_args(data_dir, ckpt, epochs=1000)
    else:
        shutil.copytree(os.path.join(work, "trained"), ckpt)
        args = trainer_args(data_dir, ckpt, "--evaluate")
    return run_job(command(port, np_, args, work), env, timeout,
                   signal_after_rows=1 if path == "sigterm" else None, ckpt=ckpt)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ports", default="ddp,horovod")
    p.add_argument("--paths", default="end,stop-at,sigterm")
    p.add_argument("--loops", type=int, default=100)
    p.add_argument("--np", type=int, default=3, help="processes per job (more than cores is the hard case)")
    p.add_argument("--hog", type=int, default=1, help="busy processes beside the jobs")
    p.add_argument("--timeout", type=float, default=180, help="seconds after which a job has hung")
    p.add_argument("--out", default="stress-stops", help="folder for the report and failing outputs")
    a = p.parse_args()
    ports, paths = a.ports.split(","), a.paths.split(",")
    if set(ports) - set(PORTS) or set(paths) - set(PATHS):
        p.error(f"--ports from {','.join(PORTS)}, --paths from {','.join(PATHS)}")
    if "elastic" in ports and "evaluate" in paths:
        p.error("main_elastic.py has no --evaluate: leave out one of the two")
    os.makedirs(a.out, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1",
               PATH=BIN + os.pathsep + os.environ.get("PATH", ""), **MPI_ENV)
    work = tempfile.mkdtemp(prefix="stress-stops-")
    data_dir = os.path.join(work, "data")
    trained = os.path.join(work, "trained")
    subprocess.run([sys.executable, "main.py", *trainer_args(data_dir, trained, epochs=1)], cwd=ROOT,
                   env=env, check=True, capture_output=True)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.hog)]
    counts = {f"{port} {path}": collections.Counter() for port in ports for path in paths}
    t0 = time.monotonic()
    try:
        for i in range(a.loops):
            for port in ports:
                for path in paths:
                    status, out = one(port, path, a.np, data_dir, work, a.timeout, env)
                    key, c = f"{port} {path}", counts[f"{port} {path}"]
                    c["runs"] += 1
                    kind = ("hang" if status is None else "abort" if ABORTED.search(out)
                            else None if status == clean_status(path) else f"status {status}")
                    if kind:
                        c[kind] += 1
                        name = f"{port}-{path}-{i}.log".replace(" ", "_")
                        with open(os.path.join(a.out, name), "w") as f:
                            f.write(out)
                        print(f"loop {i + 1}: {key}: {kind} (output in {a.out}/{name})", flush=True)
            if (i + 1) % 10 == 0:
                print(f"{i + 1} loops in {time.monotonic() - t0:.0f} s: "
                      + "; ".join(f"{k} {dict(v)}" for k, v in counts.items()), flush=True)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        shutil.rmtree(work, ignore_errors=True)
        report = {"loops": a.loops, "np": a.np, "hog": a.hog, "seconds": round(time.monotonic() - t0),
                  "counts": {k: dict(v) for k, v in counts.items()}}
        with open(os.path.join(a.out, "report.json"), "w") as f:
            json.dump(report, f, indent=1)
        print(json.dumps(report["counts"]))
    bad = sum(v[k] for v in counts.values() for k in v if k != "runs")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
