"""Shared test helpers: tiny synthetic data, and real trainer processes.

Every trainer run here is a real subprocess (python, horovodrun or mpirun), on
the CPU, with LeNet on a few hundred synthetic images, so the suite stays fast
on 2 cores.
"""
import csv
import os
import shutil
import subprocess
import sys

import pytest

# Idle OpenMP threads sleep instead of spinning. Tests start several processes
# on 2 cores, and spinning threads of one starve the others. Set before torch
# is imported, so it holds for this process and the ones it starts.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
PY = sys.executable
SYNTH = 500  # training images; test gets 100
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """Synthetic CIFAR-format data, generated once for the session."""
    d = tmp_path_factory.mktemp("data")
    r = run_main(["--data-dir", str(d), "--dataset", "synthetic", "--synthetic-size", str(SYNTH),
                  "--epochs", "1", "--arch", "lenet", "--checkpoint-dir", str(d / "warmup-run")])
    assert r.returncode == 0, r.stderr
    shutil.rmtree(d / "warmup-run")
    return d


def common_args(data_dir, ckpt_dir, *extra, epochs=2, batch=32, lr=0.05):
    return ["--data-dir", str(data_dir), "--dataset", "synthetic", "--synthetic-size", str(SYNTH),
            "--arch", "lenet", "--epochs", str(epochs), "--batch-size", str(batch),
            "--lr", str(lr), "--checkpoint-dir", str(ckpt_dir), *map(str, extra)]


def _env(extra=None):
    env = dict(os.environ, PYTHONUNBUFFERED="1", PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    env.update(MPI_ENV)
    env.update(extra or {})
    return env


def run(cmd, timeout=300, env=None, **kw):
    return subprocess.run(cmd, cwd=ROOT, env=_env(env), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, **kw)


def run_main(args, **kw):
    return run([PY, "main.py", *map(str, args)], **kw)


def run_horovod(np_, args, launcher="gloo", probe=None, **kw):
    """main_horovod.py under a real launcher: horovodrun --gloo/--mpi, mpirun, or plain python.

    With probe=DIR, every rank also saves its final model and history to DIR/rank<r>.pt.
    """
    entry = ["tests/rank_probe.py", str(probe)] if probe else ["main_horovod.py"]
    script = [PY, *entry, *map(str, args)]
    if launcher == "python":
        cmd = script
    elif launcher == "mpirun":
        cmd = ["mpirun", "-np", str(np_), "--hostfile", os.path.join(ROOT, "hostfile"),
               "--bind-to", "none", "-x", "PATH", "-x", "PYTHONUNBUFFERED", *script]
    else:
        cmd = [os.path.join(BIN, "horovodrun"), "-np", str(np_), f"--{launcher}", *script]
    return run(cmd, **kw)


def load_ranks(probe, size):
    return [torch.load(os.path.join(probe, f"rank{r}.pt"), map_location="cpu", weights_only=True)
            for r in range(size)]


def read_metrics(ckpt_dir):
    with open(os.path.join(ckpt_dir, "metrics.csv")) as f:
        return list(csv.DictReader(f))


def load_ckpt(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def last_line(text):
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def parse_eval(line):
    fields = dict(kv.split("=") for kv in line.split())
    return float(fields["test_loss"]), float(fields["test_acc"]), int(fields["images"])


def assert_one_line_error(result, *needles, code=None):
    """A clean failure: non-zero exit, no traceback, one error line naming the problem."""
    assert result.returncode != 0, result.stdout
    if code is not None:
        assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if "error" in ln.lower()]
    assert errors, result.stderr
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
