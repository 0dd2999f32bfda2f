"""Failures: bad input, broken files, a full disk, killed processes, exact resume, two runs
on one folder, and the modes of what a run writes."""
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time

import pytest
import torch

from helpers import (
    PY,
    ROOT,
    UNTIL_ENDED,
    assert_ok,
    assert_one_line_error,
    assert_states_equal,
    common_args,
    elastic_cmd,
    env,
    horovod_cmd,
    is_gone,
    last_line,
    load_ckpt,
    metrics_rows,
    parse_eval,
    probe_cmd,
    rank_pids,
    read_metrics,
    run,
    run_ddp,
    run_horovod,
    run_main,
    wait_until,
    without_lr,
)
from training.run import launch


@pytest.fixture(scope="module")
def run2(data_dir, tmp_path_factory):
    """A finished 2-epoch main.py run (of --epochs 3): a checkpoint to break and resume."""
    ck = tmp_path_factory.mktemp("run2")
    r = run_main(common_args(data_dir, ck, "--stop-at", 2, epochs=3))
    assert r.returncode == 0, r.stderr
    return ck


def fresh_copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def snapshot(folder):
    return {f: open(os.path.join(folder, f), "rb").read() for f in sorted(os.listdir(folder))
            if os.path.isfile(os.path.join(folder, f))}


# ---------------------------------------------------------------------------
# Bad input: one line, non-zero exit, nothing changed on disk

@pytest.mark.parametrize("flags,needle", [
    (["--epochs", "x"], "invalid int value"),  # argparse's own check
    (["--stop-at", "9"], "--stop-at must be between 1 and --epochs"),  # the trainer's
])
def test_bad_flags_are_usage_errors(data_dir, tmp_path, flags, needle):
    # How a usage error ends the process; every check's own message is tests/test_cli.py's.
    r = run_main(common_args(data_dir, tmp_path / "ck") + flags)
    assert_one_line_error(r, needle, code=2)
    assert not (tmp_path / "ck").exists()


def test_partial_and_corrupt_datasets(data_dir, tmp_path):
    src = os.path.join(data_dir, "synthetic-500-seed0", "cifar-10-batches-py")
    for case in ("partial", "corrupt"):
        real = tmp_path / case / "cifar-10-batches-py"
        shutil.copytree(src, real)
        if case == "partial":
            os.remove(real / "data_batch_3")
        else:
            (real / "test_batch").write_bytes((real / "test_batch").read_bytes()[:2000])
        r = run_main(["--data-dir", tmp_path / case, "--arch", "lenet", "--checkpoint-dir", tmp_path / "ck"])
        assert_one_line_error(r, "data_batch_3" if case == "partial" else "corrupt CIFAR batch file", code=1)
    assert not (tmp_path / "ck").exists() or not os.listdir(tmp_path / "ck")


@pytest.mark.parametrize("damage,needle", [
    ("missing", "no checkpoint at"),
    ("truncated", "truncated or corrupt"),
    ("garbage", "truncated or corrupt"),
])
def test_resume_from_missing_or_broken_checkpoint(run2, data_dir, tmp_path, damage, needle):
    ck = fresh_copy(run2, tmp_path / "ck")
    blob = (ck / "ckpt.pth").read_bytes()
    if damage == "missing":
        os.remove(ck / "ckpt.pth")
    elif damage == "truncated":
        (ck / "ckpt.pth").write_bytes(blob[:len(blob) // 2])
    else:
        (ck / "ckpt.pth").write_bytes(random.Random(0).randbytes(4096))  # the same bytes every run
    before = snapshot(ck)
    r = run_main(common_args(data_dir, ck, "--resume", epochs=3))
    assert_one_line_error(r, needle, code=1)
    assert snapshot(ck) == before


def test_checkpoint_of_another_arch_or_class_count(run2, data_dir, tmp_path):
    r = run_main(common_args(data_dir, run2, "--evaluate") + ["--arch", "vgg11"])
    assert_one_line_error(r, "--arch lenet", code=1)
    # Same arch name, 100 classes: the last layer's shape gives it away.
    state = load_ckpt(run2 / "ckpt.pth")
    state["model"]["fc3.weight"] = torch.zeros(100, 84)
    state["model"]["fc3.bias"] = torch.zeros(100)
    torch.save(state, tmp_path / "c100.pth")
    r = run_main(common_args(data_dir, run2, "--evaluate", "--checkpoint", tmp_path / "c100.pth"))
    assert_one_line_error(r, "fc3.weight", "(100, 84)", code=1)


def test_unwritable_checkpoint_dir(data_dir, tmp_path):
    (tmp_path / "afile").write_text("not a folder")
    r = run_main(common_args(data_dir, tmp_path / "afile" / "ck"))
    assert_one_line_error(r, "cannot write to --checkpoint-dir", code=1)


def test_full_disk_during_save_keeps_the_previous_checkpoint(run2, data_dir, tmp_path):
    """A real full disk: a 1 MiB tmpfs holding a checkpoint, with too little room for the next."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                             capture_output=True).returncode == 0
    try:
        ck = mnt / "ck"
        ck.mkdir()
        shutil.copy(run2 / "ckpt.pth", ck / "ckpt.pth")
        shutil.copy(run2 / "metrics.csv", ck / "metrics.csv")
        before = snapshot(ck)
        if mounted:
            # Fill the disk so that tb/ events fit but a second checkpoint does not.
            free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
            (mnt / "filler").write_bytes(b"\0" * max(0, free - 200_000))
            r = run_main(common_args(data_dir, ck, "--resume", epochs=3))
        else:  # no mount here: a file-size limit makes large writes fail instead
            r = run_main(common_args(data_dir, ck, "--resume", epochs=3),
                         preexec_fn=lambda: _limit_file_size(200_000))
        assert_one_line_error(r, "could not write", "ckpt.pth", code=1)
        assert snapshot(ck)["ckpt.pth"] == before["ckpt.pth"]
        assert load_ckpt(ck / "ckpt.pth")["epoch"] == 2
        assert not [f for f in os.listdir(ck) if f.endswith(".tmp")]
    finally:
        if mounted:
            subprocess.run(["umount", str(mnt)])


def _limit_file_size(n):
    import resource
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))


def test_error_on_one_rank_ends_all_ranks(run2, data_dir, tmp_path):
    ck = fresh_copy(run2, tmp_path / "ck")
    (ck / "ckpt.pth").write_bytes(b"PK\x03\x04 not really a zip")
    t0 = time.monotonic()
    r = run_horovod(2, common_args(data_dir, ck, "--resume", epochs=3), "gloo", timeout=120)
    assert time.monotonic() - t0 < 60
    assert r.returncode != 0
    rank_lines = [ln for ln in r.stderr.splitlines() if ln.startswith(("[0]", "[1]"))]
    # horovodrun forwards each rank's stderr on its own thread, so the two
    # ranks' lines may arrive in either order: check each rank's own line.
    rank0 = [ln for ln in rank_lines if ln.startswith("[0]")]
    rank1 = [ln for ln in rank_lines if ln.startswith("[1]")]
    assert any("truncated or corrupt" in ln for ln in rank0), rank_lines
    assert any(launch.PEER_FAILED in ln for ln in rank1), rank_lines
    assert not any("Traceback" in ln for ln in rank_lines), "ranks print one line, not a traceback"
    debug = run_main(common_args(data_dir, ck, "--resume", "--debug", epochs=3))
    assert debug.returncode != 0 and "Traceback" in debug.stderr


# ---------------------------------------------------------------------------
# Atomic, safe checkpoints

def test_killed_writer_leaves_the_previous_checkpoint(run2, tmp_path):
    ck = fresh_copy(run2, tmp_path / "ck")
    before = (ck / "ckpt.pth").read_bytes()
    r = subprocess.run(probe_cmd("killed_writer", ck / "ckpt.pth"), cwd=ROOT, env=env())
    assert r.returncode == -signal.SIGKILL
    assert (ck / "ckpt.pth").read_bytes() == before
    assert load_ckpt(ck / "ckpt.pth")["epoch"] == 2


class _Payload:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_checkpoint_with_pickled_code_is_refused(run2, data_dir, tmp_path):
    marker = tmp_path / "code-ran"
    state = load_ckpt(run2 / "ckpt.pth")
    state["hook"] = _Payload(str(marker))
    torch.save(state, tmp_path / "evil.pth")
    r = run_main(common_args(data_dir, run2, "--evaluate", "--checkpoint", tmp_path / "evil.pth"))
    assert_one_line_error(r, "refusing to load", code=1)
    assert not marker.exists()


# ---------------------------------------------------------------------------
# Divergence

KEPT = ("ckpt.pth", "best.pth", "metrics.csv")
# One step an epoch (the batch is larger than a rank's share of the 500 images) at an LR so large
# that the step's own training loss is finite but the weights it leaves evaluate to nan: only the
# guard's check of the test loss and the weights stops the epoch before it is saved.
NAN_EVAL = dict(batch=1024, lr=1e38)
LAUNCH = {"main": lambda a, tmp: run_main(a), "mpirun": lambda a, tmp: run_horovod(2, a, "mpirun"),
          "ddp": lambda a, tmp: run_ddp(2, a), "elastic": lambda a, tmp: run(elastic_cmd(slots(tmp), 2, 2, 2, a))}


def slots(tmp):
    (tmp / "slots").write_text("2\n")
    return tmp / "slots"


def assert_diverged(r, port, where, what):
    """One line from rank 0 names where, what became non-finite, the LR and the fix, and no rank
    printed a traceback. The trainer's status is 3: main.py's and mpirun's (which passes a
    rank's on); horovodrun and torchrun end with their own 1 and report the ranks' 3. torchrun
    reports both ranks, its root cause (the rank that ended first) last: that one's status is 3,
    and the other's is 3 too, or SIGTERM where the agent stopped it first, having seen the 3."""
    out = r.stdout + r.stderr
    if port in ("main", "mpirun"):
        assert r.returncode == 3, out[-3000:]
    elif port in ("horovod", "elastic"):
        assert r.returncode == 1 and "Exit code: 3\n" in out, out[-3000:]
    else:
        codes = re.findall(r"^\s+exitcode\s*: (-?\d+) ", out, re.M)
        assert r.returncode == 1 and len(codes) == 2 and codes[-1] == "3", out[-3000:]
        assert codes[0] == "3" or (codes[0] == "-15" and "closing signal SIGTERM" in out), out[-3000:]
    said = [ln for ln in r.stderr.splitlines() if "diverged" in ln]
    assert len(said) == 1, r.stderr[-3000:]  # every rank stops alike; rank 0 alone says it
    assert f"training diverged in {where}: {what} at LR" in said[0], said
    assert "--resume --lr" in said[0] and "--warmup-epochs" in said[0], said
    assert "<stderr>:Traceback" not in out and "[rank0]: Traceback" not in out, out[-3000:]
    assert "[rank1]: Traceback" not in out and (port not in ("main", "mpirun") or "Traceback" not in out)


# main_horovod.py under mpirun here; under horovodrun (its own status, 1) in the mid-epoch test below.
@pytest.mark.parametrize("port", ["main", "mpirun", "ddp", "elastic"])
def test_an_epoch_that_evaluates_to_nan_is_never_saved(run2, data_dir, tmp_path, port):
    # Fresh: epoch 1's training loss is finite, its test loss nan, and nothing is written.
    fresh = tmp_path / "fresh"
    r = LAUNCH[port](common_args(data_dir, fresh, **NAN_EVAL, epochs=3), tmp_path)
    assert_diverged(r, port, "epoch 1", "the test loss became nan")
    assert not any((fresh / f).exists() for f in KEPT), os.listdir(fresh)
    if port != "main":
        return  # the resumed case runs the same engine and loop code under every port
    # Resumed after 2 finite epochs: epoch 3 diverges, and the files stay as epoch 2 left them;
    # a resume from what is left trains.
    resumed = fresh_copy(run2, tmp_path / "resumed")
    before = {f: (resumed / f).read_bytes() for f in KEPT}
    r = LAUNCH[port](common_args(data_dir, resumed, "--resume", **NAN_EVAL, epochs=3), tmp_path)
    assert_diverged(r, port, "epoch 3", "the test loss became nan")
    assert {f: (resumed / f).read_bytes() for f in KEPT} == before, "the diverged epoch saved nothing"
    assert_ok(run_main(without_lr(common_args(data_dir, resumed, "--resume", epochs=3))))
    rows = read_metrics(resumed)
    assert [x["epoch"] for x in rows] == ["1", "2", "3"] and all(math.isfinite(float(x["test_loss"])) for x in rows)


def test_a_loss_that_turns_nan_mid_epoch_stops_at_the_next_log_interval(data_dir, tmp_path):
    # 8 images a step: step 1's loss is finite, the steps after it are not; the reduced loss read
    # at step 4 (--log-interval 4) stops both ranks there, and nothing of the epoch is written.
    ck = tmp_path / "ck"
    r = run_horovod(2, common_args(data_dir, ck, "--log-interval", 4, batch=8, lr=1e38), "gloo")
    assert_diverged(r, "horovod", "epoch 1 (step 4 of 32)", "the training loss became nan")
    assert not any((ck / f).exists() for f in KEPT), os.listdir(ck)


def test_checkpoint_with_non_finite_weights_is_refused(run2, data_dir, tmp_path):
    ck = tmp_path / "ck"
    fresh_copy(run2, ck)
    state = load_ckpt(ck / "ckpt.pth")
    state["model"]["conv1.weight"][0, 0, 0, 0] = float("nan")
    torch.save(state, ck / "ckpt.pth")
    r = run_main(common_args(data_dir, ck, "--auto-resume", epochs=3))
    assert_one_line_error(r, "holds non-finite weights (conv1.weight)", "--overwrite", code=1)


# ---------------------------------------------------------------------------
# pytorch-cifar checkpoints

def test_pytorch_cifar_checkpoint_evaluates_and_resumes(run2, data_dir, tmp_path):
    ours = load_ckpt(run2 / "ckpt.pth")
    # Exactly what pytorch-cifar's main.py saves after DataParallel: module.-prefixed keys.
    torch.save({"net": {"module." + k: v for k, v in ours["model"].items()}, "acc": 41.0, "epoch": 1},
               tmp_path / "kuangliu.pth")
    r = run_main(common_args(data_dir, tmp_path / "unused", "--evaluate", "--checkpoint", tmp_path / "kuangliu.pth"))
    assert r.returncode == 0, r.stderr
    mine = run_main(common_args(data_dir, run2, "--evaluate"))
    assert parse_eval(last_line(r.stdout)) == parse_eval(last_line(mine.stdout))
    ck = tmp_path / "ck"
    r = run_main(common_args(data_dir, ck, "--resume", "--checkpoint", tmp_path / "kuangliu.pth", epochs=3))
    assert r.returncode == 0, r.stderr
    state = load_ckpt(ck / "ckpt.pth")
    assert state["epoch"] == 3
    assert [x["epoch"] for x in read_metrics(ck)] == ["3"]  # epoch 1 was its last: starts at 3 of 3
    assert "epoch 3/3" in r.stdout and "epoch 2/3" not in r.stdout


# ---------------------------------------------------------------------------
# Exact resume

def _columns(rows):
    return [(r["epoch"], r["lr"], r["train_loss"], r["train_acc"], r["test_loss"], r["test_acc"]) for r in rows]


def test_stopped_and_resumed_equals_uninterrupted(data_dir, tmp_path):
    # main.py. At np=2, test_multihost.py's horovodrun run stops, resumes across two hosts and
    # equals the uninterrupted one-host run, bit for bit.
    full, part = tmp_path / "full", tmp_path / "part"
    assert run_main(common_args(data_dir, full, epochs=3)).returncode == 0
    assert run_main(common_args(data_dir, part, "--stop-at", 2, epochs=3)).returncode == 0
    assert load_ckpt(part / "ckpt.pth")["epoch"] == 2
    resume = common_args(data_dir, part, "--resume", epochs=3)
    i = resume.index("--lr")
    del resume[i:i + 2]  # no --lr: continue the saved schedule
    assert run_main(resume).returncode == 0
    assert_states_equal(load_ckpt(full / "ckpt.pth")["model"], load_ckpt(part / "ckpt.pth")["model"],
                        "the resumed and the uninterrupted run")
    assert _columns(read_metrics(full)) == _columns(read_metrics(part))


# ---------------------------------------------------------------------------
# SIGTERM, as Slurm and Kubernetes end jobs: to the launcher, or to one rank

@pytest.mark.parametrize("launcher,target", [("gloo", "launcher"), ("mpirun", "rank 1")])
def test_sigterm_ends_every_rank_with_one_line_and_resume_works(data_dir, tmp_path, jobs, launcher, target):
    ck = tmp_path / "ck"
    job = jobs(horovod_cmd(2, common_args(data_dir, ck, "--warmup-epochs", 0, epochs=UNTIL_ENDED), launcher))
    wait_until(lambda: len(metrics_rows(ck)) >= 2, 120, "2 finished epochs", job)
    pids = rank_pids("main_horovod.py", str(ck))
    assert set(pids) == {0, 1}, pids
    if target == "launcher":
        job.signal(signal.SIGTERM)  # horovodrun passes it to every rank
    else:
        os.kill(pids[1], signal.SIGTERM)  # mpirun then ends the other rank
    t_term = time.monotonic()
    rc = job.wait(timeout=30)  # fails the test if the job is still running
    assert time.monotonic() - t_term < 30
    # mpirun reports the ranks' 143. horovodrun usually exits 1, but may exit 0: its launcher
    # waits on each rank's shell from two threads, and when psutil's wait reaps the shell first,
    # Popen.wait() reads 0 (horovod/runner/common/util/safe_shell_exec.py). Each rank's own 143
    # is what its "interrupted ... by SIGTERM" line, checked below, is printed with.
    assert rc != 0 or launcher == "gloo", rc
    assert all(is_gone(pid) for pid in pids.values()), "a rank is still running"
    out = job.output()
    # One line from each rank: interrupted, or (a rank whose peer went first) stopping.
    said = {r: [ln for ln in out.splitlines() if f"main_horovod.py: interrupted (rank {r})" in ln
                or f"main_horovod.py: error (rank {r})" in ln] for r in (0, 1)}
    assert all(len(lines) == 1 for lines in said.values()), out[-3000:]
    sigterm = "by SIGTERM; the last finished epoch is in the checkpoint"
    assert all(ln.endswith((sigterm, f"({launch.PEER_HINT})"))
               for lines in said.values() for ln in lines), said
    assert said[1][0].endswith(sigterm) or (target == "launcher" and said[0][0].endswith(sigterm)), said
    # No rank printed a traceback (horovodrun prints its own, with no rank prefix; mpirun none).
    assert "]<stderr>:Traceback" not in out and (launcher != "mpirun" or "Traceback" not in out), out[-3000:]
    # The checkpoint is whole and holds the last finished epoch; the resume goes on from it.
    done = load_ckpt(ck / "ckpt.pth")["epoch"]
    assert done >= 2 and len(read_metrics(ck)) == done
    assert not [f for f in os.listdir(ck) if f.endswith(".tmp")]
    r = run_horovod(1, without_lr(common_args(data_dir, ck, "--resume", "--warmup-epochs", 0, "--stop-at",
                                              done + 1, epochs=UNTIL_ENDED)), "python")
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"after epoch {done}" in r.stdout
    assert [int(x["epoch"]) for x in read_metrics(ck)] == list(range(1, done + 2))


# ---------------------------------------------------------------------------
# One run per checkpoint folder, and restarts that take it over

def test_two_runs_started_together_on_one_folder_one_is_refused(data_dir, tmp_path, jobs):
    # Both have a schedule they cannot finish, so only the folder's lock tells them apart.
    ck = tmp_path / "ck"
    cmd = [PY, "main.py", *common_args(data_dir, ck, epochs=UNTIL_ENDED)]
    both = [jobs(cmd), jobs(cmd)]
    ended = wait_until(lambda: [j for j in both if j.proc.poll() is not None], 120, "one run refused")
    assert len(ended) == 1, [j.output()[-2000:] for j in both]
    loser, winner = ended[0], next(j for j in both if j is not ended[0])
    assert loser.wait(timeout=10) == 1
    errors = [ln for ln in loser.output().splitlines() if "error" in ln.lower()]
    assert errors == [f"main.py: error: --checkpoint-dir {ck} is in use by another run (host "
                      f"{socket.gethostname()}, process {winner.proc.pid}); wait for it to end, or "
                      "choose another --checkpoint-dir"], loser.output()[-2000:]
    wait_until(lambda: len(metrics_rows(ck)) >= 2, 120, "2 finished epochs", winner)
    winner.signal(signal.SIGTERM)
    assert winner.wait(timeout=30) == 143
    done = load_ckpt(ck / "ckpt.pth")
    assert [r["epoch"] for r in done["history"]] == list(range(1, done["epoch"] + 1))
    assert [int(r["epoch"]) for r in read_metrics(ck)] == list(range(1, done["epoch"] + 1))


def test_a_restart_takes_the_folder_over_once_the_old_run_is_gone(data_dir, tmp_path, jobs):
    ck = tmp_path / "ck"
    args = without_lr(common_args(data_dir, ck, "--auto-resume", epochs=UNTIL_ENDED))
    first = jobs([PY, "main.py", *args])  # --auto-resume with no checkpoint: a fresh start
    wait_until(lambda: len(metrics_rows(ck)) >= 1, 120, "a finished epoch", first)
    first.kill()  # SIGKILL: no handler runs, and the kernel drops the lock
    done = load_ckpt(ck / "ckpt.pth")["epoch"]
    r = run_main(args + ["--stop-at", done + 1])
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"resuming {ck / 'ckpt.pth'} after epoch {done}" in r.stdout
    assert [int(x["epoch"]) for x in read_metrics(ck)] == list(range(1, done + 2))
    # Restarted again after the run's last epoch: nothing to train, and no error.
    again = run_main(args + ["--stop-at", done + 1])
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"has finished epoch {done + 1}: nothing left to train" in again.stdout
    assert [int(x["epoch"]) for x in read_metrics(ck)] == list(range(1, done + 2))
