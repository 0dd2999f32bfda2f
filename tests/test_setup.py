"""scripts/setup.sh against a PyTorch that is already installed (TORCH=system), in a fresh copy.

GPU clusters and NGC images ship their own CUDA PyTorch. Here the project's own .venv plays
that Python: a copy of the repository is set up with TORCH=system PYTHON=<.venv/bin/python>,
offline (no index reachable, an empty wheel folder), and must import torch from outside its
own .venv, install no second copy and get a working Horovod (from the wheel cache that `make
setup` filled). Training at np=2 on such a set-up is tests/test_container.py's (an image's
Python). Also: make gpu-check without a GPU says so in one line.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers import PY, ROOT, env

SITE = "lib/python{0}.{1}/site-packages".format(*sys.version_info[:2])


@pytest.fixture(scope="module")
def system_clone(tmp_path_factory):
    clone = tmp_path_factory.mktemp("clone")
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for f in filter(None, files):
        if os.path.isfile(os.path.join(ROOT, f)):
            os.makedirs(os.path.dirname(os.path.join(clone, f)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, f), os.path.join(clone, f))
    wheels = tmp_path_factory.mktemp("wheels")  # empty: everything is there already
    offline = {"TORCH": "system", "PYTHON": PY, "WHEELS": str(wheels),
               "HOROVOD_SDIST": "/nonexistent/horovod.tar.gz",  # the cached wheel must serve
               "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_NO_INPUT": "1"}
    r = subprocess.run(["bash", "scripts/setup.sh"], cwd=clone, env=env(offline), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    return clone, r


def test_system_torch_is_used_not_copied(system_clone):
    clone, r = system_clone
    py = clone / ".venv" / "bin" / "python"
    where = subprocess.run([py, "-c", "import torch, horovod; print(torch.__file__); print(horovod.__file__)"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert where[0].startswith(os.path.join(ROOT, ".venv")), where  # the other Python's torch
    assert where[1].startswith(str(clone / ".venv")), where  # Horovod built for it, in this venv
    assert not (clone / ".venv" / SITE / "torch").exists(), "a second copy of torch was installed"
    assert "installing what" not in r.stdout, "nothing was missing, so nothing may be installed"
    assert (clone / ".venv" / "torch-mode.txt").read_text().startswith("system ")


def test_a_later_setup_without_torch_keeps_the_system_torch(system_clone):
    """`make test` runs the set-up again with no TORCH: the .venv made for another Python's
    torch stays as it is (still offline: nothing may be fetched), with no rebuild."""
    clone, _ = system_clone
    offline = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_NO_INPUT": "1",
               "HOROVOD_SDIST": "/nonexistent/horovod.tar.gz"}
    later = {k: v for k, v in env(offline).items() if k not in ("TORCH", "PYTHON", "WHEELS")}
    r = subprocess.run(["bash", "scripts/setup.sh"], cwd=clone, env=later, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert "making it anew" not in r.stdout and "already installed" in r.stdout, r.stdout
    assert (clone / ".venv" / "torch-mode.txt").read_text().startswith("system ")


def test_gpu_check_jobs_run_on_the_cpu(tmp_path):
    # No GPU runs in CI, so gpu-check's job list runs here on the CPU: a job under each of the
    # ports' launchers (Horovod at np=1 with its hooks on, DDP under torchrun) must report
    # images/s, and --resume must continue each. The other jobs differ from these only in the
    # trainer's flags, which have tests of their own.
    out = tmp_path / "gpu-check.json"
    pick = ["--only=gradient hooks on", "--only=main_ddp.py np=1 (torchrun)", "--skip=bf"]
    r = subprocess.run([PY, "-m", "scripts.gpu_check", "--device", "cpu", "--no-setup", *pick, "--out", str(out)],
                       cwd=ROOT, env=env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 5 and all(ln.startswith("gpu-check: ") for ln in lines), lines
    assert sum("img/s" in ln for ln in lines) == 4, lines
    assert any(ln.startswith("gpu-check: main_ddp.py np=1 (torchrun): ") for ln in lines), lines
    for port in ("main_horovod.py np=1, hooks on", "main_ddp.py np=1"):
        assert any(ln.startswith(f"gpu-check: {port}, --resume: ") and "(epoch 2 of 2)" in ln for ln in lines), lines
    got = json.loads(out.read_text())
    assert got["ok"] and got["device"] == "cpu" and all(j["ok"] for j in got["jobs"])


def test_gpu_check_without_a_gpu_is_one_line_and_quick():
    r = subprocess.run(["python3", "-m", "scripts.gpu_check"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env=env({"PATH": "/usr/bin:/bin"}))  # no nvidia-smi on this PATH
    assert r.returncode == 1
    lines = (r.stdout + r.stderr).strip().splitlines()
    assert len(lines) == 1 and "no NVIDIA GPU" in lines[0], lines


def test_bad_torch_mode_is_one_line():
    r = subprocess.run(["bash", "scripts/setup.sh"], cwd=ROOT, env=env({"TORCH": "conda"}), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and r.stderr.strip() == \
        "[setup] error: TORCH must be 'pinned' (the default) or 'system', not 'conda'"
