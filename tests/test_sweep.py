"""--sweep (sweep.py): one MPI job split by mpi4py into independent Horovod runs.

mpirun -np 4 with two runs of two ranks each: a run is bitwise the same run trained alone with
horovodrun -np 2 --mpi (the same controller), a run that diverges ends alone while the other
finishes, and the job's status says a run failed. A sweep stopped part-way (by --stop-at, or by
SIGTERM to every process as Slurm pre-empts) and submitted again continues each run from its own
checkpoint, and once more trains nothing.
Bad sweeps stop before any work. (The share of a host a sweep's process takes: test_devices.py.)
"""
import csv
import os
import re
import signal
import time

import pytest

from helpers import (
    ONE_THREAD,
    PY,
    UNTIL_ENDED,
    assert_ok,
    assert_states_equal,
    common_args,
    horovod_cmd,
    is_gone,
    load_ckpt,
    metrics_rows,
    parse,
    rank_pids,
    read_metrics,
    run,
    run_horovod,
    wait_until,
)
from sweeps import sweep
from training.base.errors import UsageError

RUN_COLS = ("epoch", "lr", "train_loss", "train_acc", "test_loss", "test_acc", "world_size")


def sweep_cmd(np_, args, launcher):
    """main_sweep.py under a real launcher (mpirun, horovodrun --mpi or --gloo)."""
    return horovod_cmd(np_, args, launcher, script="main_sweep.py")


def sweep_rows(ck):
    with open(ck / "sweep.csv") as f:
        return {r["run"]: r for r in csv.DictReader(f)}


def test_each_run_is_the_run_alone_and_a_diverged_run_ends_alone(data_dir, tmp_path):
    # One step an epoch: at LR 1e38 the step's loss is finite and the weights it leaves evaluate to
    # nan, which the divergence guard stops before the epoch is saved.
    ck, alone = tmp_path / "sweep", tmp_path / "alone"
    r = run(sweep_cmd(4, [*common_args(data_dir, ck, batch=1024), "--sweep", "lr=0.05,1e38"], "mpirun"),
            timeout=300, env_extra=ONE_THREAD)
    assert r.returncode == 1, r.stdout[-2000:]
    errors = [ln for ln in r.stderr.splitlines() if "main_sweep.py: error" in ln]
    assert len(errors) == 2, r.stderr[-3000:]  # the run's own line, then the job's
    assert errors[0].startswith("main_sweep.py: error: run lr1e38: training diverged in epoch 1: "
                                "the test loss became nan"), errors
    assert "1 of 2 runs failed" in errors[1] and "Traceback" not in r.stderr
    rows = sweep_rows(ck)
    assert rows["lr0.05"]["status"] == "finished" and rows["lr0.05"]["epochs"] == "2"
    assert rows["lr1e38"]["status"].startswith("failed: training diverged")
    assert not [f for f in ("ckpt.pth", "best.pth", "metrics.csv") if (ck / "lr1e38" / f).exists()]
    assert (ck / "sweep.svg").stat().st_size > 0
    assert "lr=0.05     1  " in r.stdout, r.stdout[-2000:]  # the table
    # The finished run, bitwise, is the same flags trained alone at np=2, with the same threads
    # per process (one) on both sides, whatever the machine's cores.
    assert_ok(run_horovod(2, common_args(data_dir, alone, batch=1024), "mpi", env_extra=ONE_THREAD))
    assert_states_equal(load_ckpt(ck / "lr0.05" / "ckpt.pth")["model"], load_ckpt(alone / "ckpt.pth")["model"],
                        "sweep run and the run alone")
    assert [[x[c] for c in RUN_COLS] for x in read_metrics(ck / "lr0.05")] == \
        [[x[c] for c in RUN_COLS] for x in read_metrics(alone)]
    assert float(rows["lr0.05"]["final_test_acc"]) == float(read_metrics(alone)[-1]["test_acc"])


def test_an_error_that_one_rank_of_a_run_meets_ends_that_run_alone(data_dir, tmp_path):
    # Two runs of two ranks (mpirun -np 4). seed1's folder holds a corrupt ckpt.pth, which its rank
    # 0 alone reads (the sweep's --auto-resume): that run ends with rank 0's line naming it, its
    # other rank stops without a line of its own, seed0 finishes, and the job exits 1.
    ck = tmp_path / "ck"
    (ck / "seed1").mkdir(parents=True)
    (ck / "seed1" / "ckpt.pth").write_bytes(b"PK\x03\x04 not really a zip")
    r = run(sweep_cmd(4, [*common_args(data_dir, ck, epochs=1), "--sweep", "seed=0,1"], "mpirun"),
            timeout=300)
    assert r.returncode == 1, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if "main_sweep.py: error" in ln]
    assert len(errors) == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert errors[0].startswith("main_sweep.py: error: run seed1: checkpoint ") \
        and "truncated or corrupt" in errors[0], errors
    assert "1 of 2 runs failed" in errors[1], errors
    rows = sweep_rows(ck)
    assert rows["seed0"]["status"] == "finished" and rows["seed0"]["epochs"] == "1"
    assert rows["seed1"]["status"].startswith("failed: checkpoint ")


def test_four_runs_queue_on_two_single_process_groups_each_the_run_alone(data_dir, tmp_path):
    # mpirun -np 2, --ranks-per-run 1: two groups take the four runs from the queue, the second
    # two after a first. Every line a run prints names it; a run's weights are those of the same
    # run alone at np=1, with the same threads (one) per process (two of the four, which between
    # them hold each seed and each LR).
    ck = tmp_path / "ck"
    r = assert_ok(run(sweep_cmd(2, [*common_args(data_dir, ck), "--sweep", "seed=0,1", "--sweep", "lr=0.1,0.2",
                                    "--ranks-per-run", 1], "mpirun"), timeout=300, env_extra=ONE_THREAD))
    rows = sweep_rows(ck)
    names = ["seed0_lr0.1", "seed0_lr0.2", "seed1_lr0.1", "seed1_lr0.2"]
    assert list(rows) == names and all(x["status"] == "finished" and x["epochs"] == "2" for x in rows.values())
    assert {x["ranks"] for x in rows.values()} == {"0", "1"}, rows  # each group took runs
    epoch_lines = [ln for ln in r.stdout.splitlines() if re.search(r"\bepoch \d/2 ", ln)]
    assert len(epoch_lines) == 8 and all(re.match(r"seed=[01] lr=0\.[12] epoch [12]/2 ", ln) for ln in epoch_lines)
    for name in ("seed0_lr0.1", "seed1_lr0.2"):
        seed, lr = re.match(r"seed(\d)_lr([\d.]+)", name).groups()
        alone = tmp_path / f"alone-{name}"
        assert_ok(run([PY, "main_horovod.py", *common_args(data_dir, alone, "--seed", seed, lr=lr)],
                      env_extra=ONE_THREAD))
        assert_states_equal(load_ckpt(ck / name / "ckpt.pth")["model"], load_ckpt(alone / "ckpt.pth")["model"],
                            f"{name} in the queued sweep and alone")
    assert "best run: " + str(ck / max(names, key=lambda n: float(rows[n]["final_test_acc"]))) in r.stdout


def test_a_long_run_holds_back_only_its_own_group(data_dir, tmp_path):
    # Runs of 12, 1, 2 and 3 epochs on two groups: while one group trains the long run, the other
    # takes the short ones as each ends, where a fixed split would have given the first group
    # the third run too.
    ck = tmp_path / "ck"
    assert_ok(run(sweep_cmd(2, [*common_args(data_dir, ck), "--sweep", "epochs=12,1,2,3"], "mpirun"), timeout=300))
    rows = sweep_rows(ck)
    assert {n: (x["status"], x["epochs"]) for n, x in rows.items()} == \
        {f"epochs{e}": ("finished", str(e)) for e in (12, 1, 2, 3)}, rows
    assert rows["epochs2"]["ranks"] == rows["epochs1"]["ranks"] != rows["epochs12"]["ranks"], rows


def test_a_failing_run_ends_alone_and_its_group_takes_the_next(data_dir, tmp_path):
    # lr=1e38 at one step an epoch diverges in epoch 1; its group then trains the third run. The
    # other group's run trains 10 epochs, so that the failing group is free first by 9 of them.
    ck = tmp_path / "ck"
    r = run(sweep_cmd(2, [*common_args(data_dir, ck, batch=1024, epochs=10), "--sweep", "lr=1e38,0.05,0.1"],
                      "mpirun"), timeout=300)
    assert r.returncode == 1, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if "main_sweep.py: error" in ln]
    assert len(errors) == 2 and errors[0].startswith("main_sweep.py: error: run lr1e38: training diverged"), errors
    assert "1 of 3 runs failed" in errors[1]
    rows = sweep_rows(ck)
    assert rows["lr1e38"]["status"].startswith("failed: ") and rows["lr0.05"]["status"] == "finished"
    assert rows["lr0.1"]["status"] == "finished" and rows["lr0.1"]["ranks"] == rows["lr1e38"]["ranks"], rows


def test_a_resubmitted_sweep_continues_each_run_and_then_trains_nothing(data_dir, tmp_path):
    ck = tmp_path / "ck"
    cmd = [*common_args(data_dir, ck, epochs=3), "--sweep", "seed=0,1"]
    assert_ok(run(sweep_cmd(2, [*cmd, "--stop-at", 1], "mpirun"), timeout=300))
    assert {name: r["epochs"] for name, r in sweep_rows(ck).items()} == {"seed0": "1", "seed1": "1"}
    first = {s: read_metrics(ck / s) for s in ("seed0", "seed1")}
    r = assert_ok(run(sweep_cmd(2, cmd, "mpi"), timeout=300))  # horovodrun --mpi, the same job
    assert r.stdout.count("after epoch 1, best test acc") == 2, r.stdout[-2000:]  # each resumed
    for s in ("seed0", "seed1"):
        rows = read_metrics(ck / s)
        assert [x["epoch"] for x in rows] == ["1", "2", "3"] and rows[:1] == first[s]
    assert first["seed0"][0]["train_loss"] != first["seed1"][0]["train_loss"], "the seeds differ"
    assert "all runs     2  " in r.stdout, r.stdout[-2000:]  # seeds of one setting: mean ± std
    assert " ± " in r.stdout
    done = {s: (ck / s / "ckpt.pth").read_bytes() for s in ("seed0", "seed1")}
    r = assert_ok(run(sweep_cmd(2, cmd, "mpirun"), timeout=300))
    assert r.stdout.count("nothing left to train") == 2, r.stdout[-2000:]
    assert {s: (ck / s / "ckpt.pth").read_bytes() for s in done} == done
    assert {name: r["status"] for name, r in sweep_rows(ck).items()} == {"seed0": "finished", "seed1": "finished"}


def test_sigterm_to_every_rank_stops_every_run_and_the_resubmitted_sweep_finishes_what_was_left(
        data_dir, tmp_path, jobs):
    # SIGTERM to every process, as Slurm pre-empts a job: each run stops with its last finished
    # epoch saved; the same command again (with a last epoch) continues each run where it stopped.
    # Three runs on two groups: the third waits in the queue and is never started.
    ck = tmp_path / "ck"
    cmd = [*common_args(data_dir, ck, "--warmup-epochs", 0, epochs=UNTIL_ENDED), "--sweep", "seed=0,1,2"]
    job = jobs(sweep_cmd(2, cmd, "mpirun"))
    for s in ("seed0", "seed1"):
        wait_until(lambda s=s: len(metrics_rows(ck / s)) >= 1, 120, f"an epoch of {s}", job)
    pids = rank_pids("main_sweep.py", str(ck))
    assert set(pids) == {0, 1}, pids
    for pid in pids.values():
        os.kill(pid, signal.SIGTERM)
    t_term = time.monotonic()
    assert job.wait(timeout=30) != 0 and time.monotonic() - t_term < 30
    assert all(is_gone(pid) for pid in pids.values()), "a rank is still running"
    assert job.output().count("by SIGTERM; the last finished epoch is in the checkpoint") == 2, job.output()[-3000:]
    done = {s: load_ckpt(ck / s / "ckpt.pth")["epoch"] for s in ("seed0", "seed1")}
    assert all(len(read_metrics(ck / s)) == done[s] for s in done) and not (ck / "seed2").exists()
    # Submitted again with a last epoch: each stopped run continues after its own last epoch, the
    # third trains from the start, and none trains an epoch twice.
    last = max(done.values()) + 1
    r = assert_ok(run(sweep_cmd(2, [*cmd, "--stop-at", last], "mpirun"), timeout=300))
    for s in done:
        assert f"after epoch {done[s]}, best test acc" in r.stdout, r.stdout[-3000:]
    for s in ("seed0", "seed1", "seed2"):
        assert [int(x["epoch"]) for x in read_metrics(ck / s)] == list(range(1, last + 1))
    assert r.stdout.count("resuming ") == 2


def test_bad_sweeps_stop_before_any_work(data_dir, tmp_path):
    ck = tmp_path / "ck"
    r = run(sweep_cmd(2, [*common_args(data_dir, ck), "--sweep", "lr=0.05,0.1"], "gloo"))
    assert r.returncode != 0 and "Horovod's gloo controller; launch with mpirun" in r.stderr, r.stderr[-2000:]
    r = run(sweep_cmd(3, [*common_args(data_dir, ck), "--sweep", "lr=0.05,0.1", "--ranks-per-run", 2], "mpirun"))
    said = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert r.returncode != 0 and "--ranks-per-run 2 does not divide the 3 processes" in said[0], r.stderr[-2000:]
    assert len([ln for ln in said if "main_sweep.py: error" in ln]) == 1  # said once, by rank 0
    # Every run's flags are checked before any work (the job runs this check first, on every rank).
    argv = [*map(str, common_args(data_dir, ck)), "--sweep", "batch-size=32,0"]
    with pytest.raises(UsageError, match=r"--batch-size must be positive \(got 0\)"):
        sweep.check_sweep(parse(*argv, port="sweep"), argv, 2)
    assert not ck.exists()
