"""main_ddp.py with real processes: torchrun (gloo), beside main_horovod.py and main.py.

Every DDP run is a real `torchrun --standalone` job on the CPU with LeNet on the test run's
500 synthetic images; the module takes about two minutes on 2 idle cores.
"""
import math
import os
import re
import shutil
import signal

import pytest
import torch

from helpers import (
    ABORTED,
    UNTIL_ENDED,
    assert_ok,
    assert_ranks_identical,
    assert_states_equal,
    assert_the_diff_is_the_port,
    common_args,
    ddp_cmd,
    kill_rank_and_wait,
    last_line,
    load_ckpt,
    load_ranks,
    metrics_rows,
    parse_eval,
    read_metrics,
    run_ddp,
    run_horovod,
    run_main,
    wait_until,
    without_lr,
)
import models

ARGS = ("--warmup-epochs", 1)  # the same flags for main_ddp.py and main_horovod.py


@pytest.fixture(scope="module")
def ddp2(data_dir, tmp_path_factory):
    """torchrun np=2: 2 epochs of 3, every rank's final model in rank<r>.pt."""
    probe = tmp_path_factory.mktemp("ddp2")
    r = assert_ok(run_ddp(2, common_args(data_dir, probe / "ck", *ARGS, "--stop-at", 2, epochs=3),
                          probe=probe))
    return probe, r


@pytest.fixture(scope="module")
def hvd2(data_dir, tmp_path_factory):
    """The same run under main_horovod.py at np=2 (mpirun)."""
    probe = tmp_path_factory.mktemp("hvd2")
    assert_ok(run_horovod(2, common_args(data_dir, probe / "ck", *ARGS, "--stop-at", 2, epochs=3),
                          probe=probe))
    return probe


def test_ranks_end_bitwise_identical_and_rank0_alone_writes(ddp2):
    probe, r = ddp2
    ranks = load_ranks(probe, 2)
    assert [x["size"] for x in ranks] == [2, 2]
    # torchrun sets OMP_NUM_THREADS=1 itself; the cores are still split per local rank.
    assert [x["threads"] for x in ranks] == [max(1, len(os.sched_getaffinity(0)) // 2)] * 2
    if len(os.sched_getaffinity(0)) >= 2:
        assert not set(ranks[0]["cores"]) & set(ranks[1]["cores"]), "each rank on its own cores"
    assert_ranks_identical(ranks)
    saved = load_ckpt(probe / "ck" / "ckpt.pth")
    assert_states_equal(saved["model"], ranks[0]["model"], "the checkpoint")
    assert saved["world_size"] == 2 and not any(k.startswith("module.") for k in saved["model"])
    rows = read_metrics(probe / "ck")
    assert [x["epoch"] for x in rows] == ["1", "2"] and all(x["world_size"] == "2" for x in rows)
    # Epoch 1 ramps from 0.05 towards 0.1; epoch 2 is lr x size on the cosine of 3 epochs.
    assert 0.05 < float(rows[0]["lr"]) < 0.1
    assert float(rows[1]["lr"]) == pytest.approx(0.1 * 0.5 * (1 + math.cos(math.pi / 3)))
    assert sorted(os.listdir(probe / "ck" / "tb"))[1:] == ["hparams"], "one TensorBoard writer: rank 0's"
    assert len(re.findall(r"^epoch \d/3 ", r.stdout, re.M)) == 2, r.stdout
    # Which rank wrote what, as each process recorded its own writes (probes/writes.py):
    # rank 0 every file of the run (renamed into place whole), rank 1 nothing in the folder.
    written = [{os.path.relpath(p, probe / "ck") for p in x["written"] if p.startswith(str(probe / "ck"))}
               for x in ranks]
    assert {"ckpt.pth", "best.pth", "metrics.csv"} <= written[0] and any(p.startswith("tb/") for p in written[0])
    assert written[1] == set(), written[1]


def test_ddp_np2_equals_horovod_np2(ddp2, hvd2):
    ddp, hvd = load_ranks(ddp2[0], 2), load_ranks(hvd2, 2)
    for r in range(2):
        assert_states_equal(ddp[r]["model"], hvd[r]["model"], f"rank {r}", atol_scale=1e-6)
    for a, b in zip(ddp[0]["result"], hvd[0]["result"]):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-6)
        assert a["lr"] == pytest.approx(b["lr"], rel=1e-12)


def test_np2_with_batches_per_allreduce_equals_np1_at_the_global_batch(data_dir, tmp_path):
    # LeNet has no BatchNorm, so np=1 at 2b computes what np=2 at b does. Here each rank takes
    # two backward passes of b/2 under no_sync before one allreduce (--batches-per-allreduce 2).
    # DDP averages gradients and --lr is scaled by size and by --batches-per-allreduce, hence
    # lr/4, and no warm-up. (DDP at np=2 without accumulation equals main_horovod.py's np=2
    # above, which equals np=1 in test_main_horovod.py.)
    lr, b = 0.05, 50  # 500 images / 100 per global batch = 5 steps per epoch
    assert_ok(run_main(common_args(data_dir, tmp_path / "np1", batch=2 * b, lr=lr)))
    assert_ok(run_ddp(2, common_args(data_dir, tmp_path / "k2", "--warmup-epochs", 0,
                                     "--batches-per-allreduce", 2, batch=b // 2, lr=lr / 4)))
    one = load_ckpt(tmp_path / "np1" / "ckpt.pth")["model"]
    # Up to summation order, as in test_main_horovod.py's np=2 against np=1 (1.3e-5 of the scale seen there).
    assert_states_equal(load_ckpt(tmp_path / "k2" / "ckpt.pth")["model"], one, "k=2", atol_scale=5e-5)
    lrs = [float(read_metrics(tmp_path / d)[-1]["lr"]) for d in ("np1", "k2")]
    assert lrs[1] == pytest.approx(lrs[0]), "the LR scaled by size and batches per allreduce"
    # ...and they did move: the comparison is not of two untouched inits.
    torch.manual_seed(0)  # as utils.build_model does for --seed 0
    init = models.get_model("lenet", num_classes=10).state_dict()
    assert max((one[k] - init[k]).abs().max().item() for k in one) > 1e-3


def test_checkpoints_cross_between_horovod_and_ddp_at_another_world_size(ddp2, hvd2, data_dir, tmp_path):
    # main_horovod.py's np=2 checkpoint resumes under main_ddp.py at np=1, and main_ddp.py's
    # under main_horovod.py at np=1. The two checkpoints agree (test above), and np=1
    # computes alike in both trainers, so the two resumed runs end alike too.
    ends = []
    for src, name, resume in ((hvd2, "hvd-to-ddp", lambda a: run_ddp(1, a)),
                              (ddp2[0], "ddp-to-hvd", lambda a: run_horovod(1, a, "python"))):
        shutil.copytree(src / "ck", tmp_path / name)
        args = without_lr(common_args(data_dir, tmp_path / name, "--resume", "--warmup-epochs", 0, epochs=3))
        out = assert_ok(resume(args))
        assert out.stdout.count("resuming ") == 1 and "after epoch 2" in out.stdout, out.stdout
        rows = read_metrics(tmp_path / name)
        assert [x["epoch"] for x in rows] == ["1", "2", "3"] and rows[2]["world_size"] == "1"
        # The saved cosine continues: base 0.05 per process from epoch 0 over 3, now x 1.
        assert float(rows[2]["lr"]) == pytest.approx(0.05 * 0.5 * (1 + math.cos(2 * math.pi / 3)))
        ends.append(load_ckpt(tmp_path / name / "ckpt.pth")["model"])
    assert_states_equal(ends[0], ends[1], "resumed", atol_scale=1e-5)


def test_evaluate_at_np3_is_the_np2_runs_own_evaluation(ddp2, data_dir, tmp_path):
    # 100 test images over 3 ranks: shards of 34, 33 and 33, against the np=2 run's evaluation of
    # the same weights after its last epoch (main.py's np=1 evaluation: test_main_horovod.py).
    ck = ddp2[0] / "ck"
    args = ["--evaluate", *common_args(data_dir, ck)]
    loss, acc, images = parse_eval(last_line(assert_ok(run_ddp(3, args, probe=tmp_path)).stdout))
    assert_left_the_job_whole(tmp_path, 3)
    last = load_ckpt(ck / "ckpt.pth")["history"][-1]
    assert images == 100, "100 test images: each counted once, none padded"
    assert acc == last["test_acc"]
    assert abs(loss - last["test_loss"]) <= 1e-6 * last["test_loss"]


def assert_left_the_job_whole(probe, size):
    """No rank had a thread of its process group left as its interpreter was about to exit.
    One left there may still be dropping its last collective's tensors, which takes the GIL:
    a finalizing interpreter ends such a thread mid-destructor, and the rank aborts (SIGABRT,
    "terminate called without an active exception")."""
    left = {r: (probe / f"threads{r}.txt").read_text().split() for r in range(size)}
    assert left == {r: [] for r in range(size)}, left


def test_every_rank_leaves_the_job_whole_when_it_stops(ddp2, data_dir, tmp_path, jobs):
    # At --stop-at (the ddp2 run) and on SIGTERM to torchrun, which passes it to every rank;
    # the --evaluate path is checked at np=3 in test_evaluate_at_np3_is_the_np2_runs_own_evaluation.
    assert_left_the_job_whole(ddp2[0], 2)
    ck = tmp_path / "ck"
    job = jobs(ddp_cmd(2, common_args(data_dir, ck, epochs=UNTIL_ENDED), probe=tmp_path))
    wait_until(lambda: len(metrics_rows(ck)) >= 1, 120, "a finished epoch", job)
    job.signal(signal.SIGTERM)
    rc = job.wait(60)
    out = job.output()
    # Each rank stops with its one line; the agent, itself signalled, ends with 1. torchrun's agent
    # can abort in its own shutdown, after its SignalException (status -6, "terminate called"):
    # that is torchrun's; the ranks' ends are their lines here and the probe's records below.
    for r in (0, 1):
        assert f"main_ddp.py: interrupted (rank {r}) by SIGTERM; the last finished epoch" in out, out[-3000:]
    agent_aborted = rc == -signal.SIGABRT and "SignalException: Process" in out
    before_agent = out.split("SignalException: Process")[0] if agent_aborted else out
    assert (rc == 1 or agent_aborted) and not ABORTED.search(before_agent), out[-3000:]
    assert_left_the_job_whole(tmp_path, 2)


def test_kill_9_of_one_rank_ends_the_job(data_dir, tmp_path, jobs):
    ck = tmp_path / "ck"
    job = jobs(ddp_cmd(2, common_args(data_dir, ck, epochs=UNTIL_ENDED)))
    wait_until(lambda: len(metrics_rows(ck)) >= 1, 120, "a finished epoch", job)
    kill_rank_and_wait(job, "main_ddp.py", str(ck))
    out = job.output()
    assert "[rank0]: Traceback" not in out, out[-3000:]
    assert re.search(r"main_ddp\.py: (error \(rank 0\): stopping because a collective failed|"
                     r"interrupted \(rank 0\) by SIGTERM)", out), out[-3000:]
    assert load_ckpt(ck / "ckpt.pth")["epoch"] >= 1


def test_bad_input_is_one_line(data_dir, tmp_path):
    # Under torchrun every rank finds a usage error, and rank 0 alone says it (the port's own
    # checks, in process: tests/test_cli.py).
    r = run_ddp(2, common_args(data_dir, tmp_path / "ck", "--epochs", 0))
    assert r.returncode != 0 and "[rank0]: Traceback" not in r.stderr and "[rank1]: Traceback" not in r.stderr
    assert r.stderr.count("main_ddp.py: error: --epochs must be positive") == 1, r.stderr[-3000:]
    assert not (tmp_path / "ck").exists()


def test_twin_diff_is_only_the_port():
    assert_the_diff_is_the_port("main_ddp.py", "# DDP:")
