"""main_horovod.py with real processes: mpirun with the hostfile (the helpers' default), horovodrun (gloo and MPI)."""
import os
import re
import shutil

import pytest
import torch

from helpers import (
    PY,
    ROOT,
    assert_ok,
    assert_ranks_identical,
    assert_states_equal,
    assert_the_diff_is_the_port,
    common_args,
    horovod_cmd,
    last_line,
    load_ckpt,
    load_ranks,
    parse_eval,
    read_metrics,
    run,
    run_horovod,
    run_main,
)


@pytest.mark.parametrize("launcher", ["gloo", "mpirun"])
def test_ranks_end_bitwise_identical(request, data_dir, tmp_path, launcher):
    # resnet18 would be slow; LeNet has no BatchNorm, so use a model with BN buffers
    # too: simpledla is big, so keep LeNet and check the broadcast of a fresh run.
    if launcher == "gloo":  # np2_run is this run under horovodrun --gloo
        ck, _, probe = request.getfixturevalue("np2_run")
    else:
        ck, probe = tmp_path / "ck", tmp_path
        assert_ok(run_horovod(2, common_args(data_dir, ck, "--warmup-epochs", 1), launcher, probe=probe))
    ranks = load_ranks(probe, 2)
    assert all(r["size"] == 2 for r in ranks)
    assert_ranks_identical(ranks)
    assert_states_equal(load_ckpt(ck / "ckpt.pth")["model"], ranks[0]["model"], "the checkpoint")


def test_np2_at_batch_b_equals_np1_at_batch_2b(data_dir, tmp_path):
    # LeNet has no BatchNorm, so the two runs compute the same function of the same
    # global batches: the ranks' strided shards together are np=1's batch.
    # Horovod averages gradients, so np=2 must run at the np=1 LR: --lr is per
    # process and scaled by size, hence lr/2 here, and no warm-up.
    lr, b = 0.05, 25  # 500 images / 50 per global batch = 10 steps per epoch, 20 in all
    assert_ok(run_main(common_args(data_dir, tmp_path / "np1", batch=2 * b, lr=lr)))
    assert_ok(run_horovod(2, common_args(data_dir, tmp_path / "np2", "--warmup-epochs", 0, batch=b, lr=lr / 2)))
    one = load_ckpt(tmp_path / "np1" / "ckpt.pth")["model"]
    two = load_ckpt(tmp_path / "np2" / "ckpt.pth")["model"]
    # Equal up to summation order (one process's 2 threads over 50 images against two 1-thread
    # ranks over 25 and an allreduce): 1.3e-5 of a tensor's largest value seen after 20 steps on
    # a loaded machine. A wrong LR scale or a missing average is off by ~1e-2.
    assert_states_equal(two, one, "np=2 and np=1", atol_scale=5e-5)
    # ...and they did move: the comparison is not of two untouched inits.
    assert float(read_metrics(tmp_path / "np1")[-1]["train_acc"]) > 0.2


@pytest.fixture(scope="module")
def np2_run(data_dir, tmp_path_factory):
    """A 2-epoch run at np=2 whose checkpoint the tests below resume and evaluate, under
    horovodrun --gloo, which tags each line with its rank: (folder, result, the probe's folder
    of what each rank ended with)."""
    ck, probe = tmp_path_factory.mktemp("np2"), tmp_path_factory.mktemp("np2-probe")
    r = assert_ok(run_horovod(2, common_args(data_dir, ck, "--warmup-epochs", 1, epochs=2), "gloo", probe=probe))
    return ck, r, probe


def test_rank0_alone_writes_and_reports(np2_run):
    ck, r, _ = np2_run
    rows = read_metrics(ck)
    assert [x["epoch"] for x in rows] == ["1", "2"]
    assert all(x["world_size"] == "2" for x in rows)
    assert sorted(os.listdir(ck / "tb"))[1:] == ["hparams"], "one TensorBoard writer: rank 0's"
    assert not [f for f in os.listdir(ck) if f.endswith(".tmp")]
    epoch_lines = [ln for ln in r.stdout.splitlines() if re.search(r"epoch \d/\d ", ln)]
    assert len(epoch_lines) == 2 and all(ln.startswith("[0]") for ln in epoch_lines)


def test_lr_after_warmup_is_lr_times_size(np2_run):
    ck, _, _ = np2_run
    rows = read_metrics(ck)
    # Epoch 1 is warm-up (ramping from 0.05 towards 0.1); epoch 2 is past it:
    # lr x size on the cosine, 0.05 * 2 * (1 + cos(pi/2)) / 2.
    assert 0.05 < float(rows[0]["lr"]) < 0.1
    assert float(rows[1]["lr"]) == pytest.approx(0.05)


@pytest.mark.parametrize("np_", [3])  # np=1: main.py's resume of the np=2 run, below
def test_resume_at_another_world_size(np2_run, data_dir, tmp_path, np_):
    ck = tmp_path / "ck"
    shutil.copytree(np2_run[0], ck)
    assert_ok(run_horovod(np_, common_args(data_dir, ck, "--resume", epochs=3, lr=0.01) + ["--warmup-epochs", 0],
                          probe=tmp_path))
    ranks = load_ranks(tmp_path, np_)
    for r in ranks:  # every rank started at the saved epoch and ran only epoch 3
        assert [h["epoch"] for h in r["result"]] == [1, 2, 3]
    assert_ranks_identical(ranks)
    rows = read_metrics(ck)
    assert [x["epoch"] for x in rows] == ["1", "2", "3"]
    # --resume --lr 0.01: the new cosine starts at 0.01, scaled by the new world size.
    assert float(rows[2]["lr"]) == pytest.approx(0.01 * np_)
    assert rows[2]["world_size"] == str(np_)


def test_resume_without_lr_rescales_the_saved_schedule(np2_run, data_dir, tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(np2_run[0], ck)
    args = common_args(data_dir, ck, "--resume", epochs=4)
    args.remove("--lr"), args.remove("0.05")
    assert_ok(run_main(args))  # np=2 checkpoint, resumed by the plain trainer
    rows = read_metrics(ck)
    # Saved schedule: base 0.05 from epoch 0 over 4 epochs; np=1 scales by 1.
    assert float(rows[2]["lr"]) == pytest.approx(0.05 * 0.5 * (1 + torch.cos(torch.tensor(torch.pi / 2)).item()))
    assert rows[2]["world_size"] == "1"


def test_np1_without_launcher_and_horovodrun_mpi_with_adasum(data_dir, tmp_path):
    assert_ok(run_horovod(1, common_args(data_dir, tmp_path / "a", epochs=1), "python"))
    assert read_metrics(tmp_path / "a")[0]["world_size"] == "1"
    # Adasum on the MPI controller (the gloo refusal is tests/test_hvd_port.py's), no LR scaling
    # on the CPU, in the GPU's channels_last layout, whose tensors Adasum's collective must take
    # as the others do (tests/test_channels_last.py has the rest of that family).
    assert_ok(run_horovod(2, common_args(data_dir, tmp_path / "b", "--use-adasum", "--channels-last", epochs=1),
                          "mpi", probe=tmp_path))
    row = read_metrics(tmp_path / "b")[0]
    assert row["world_size"] == "2" and float(row["lr"]) == pytest.approx(0.05)
    assert_ranks_identical(load_ranks(tmp_path, 2))


def test_fp16_allreduce_batches_per_allreduce_and_amp(data_dir, tmp_path):
    # In the GPU's channels_last layout, whose gradients the fp16 compression and the
    # accumulation must take as they take contiguous ones; and the same in one allreduce of
    # every gradient (--grad-allreduce one), whose weights must equal the hooks' bit for bit.
    flags = ["--fp16-allreduce", "--batches-per-allreduce", 2, "--amp", "--channels-last", "--warmup-epochs", 0]
    one = tmp_path / "one"
    assert_ok(run_horovod(2, common_args(data_dir, one, *flags, "--grad-allreduce", "one", epochs=1, batch=16,
                                         lr=0.01)))
    args = common_args(data_dir, tmp_path, *flags, epochs=1, batch=16, lr=0.01)
    assert_ok(run_horovod(2, args, probe=tmp_path))
    assert_states_equal(load_ckpt(tmp_path / "ckpt.pth")["model"], load_ckpt(one / "ckpt.pth")["model"],
                        "the hooks' and one allreduce's")
    ranks = load_ranks(tmp_path, 2)
    assert_ranks_identical(ranks)
    row = read_metrics(tmp_path)[0]
    assert float(row["lr"]) == pytest.approx(0.01 * 2 * 2)  # scaled by size x batches per allreduce
    assert int(float(row["images_per_s"]) * float(row["epoch_time_s"]) + 0.5) == 500
    # The checkpoint holds the trained GradScaler's state, not a fresh one's (scale 2**16, no
    # steps counted): 250 images a rank at batch 16 and k=2 make 8 steps, and every one either
    # grew its tracker or, skipped for inf gradients, halved the scale.
    scaler = load_ckpt(tmp_path / "ckpt.pth")["scaler"]
    assert scaler["scale"] < 2.0 ** 16 or scaler["_growth_tracker"] == 8, scaler


def test_one_allreduce_resumes_where_only_rank_0_holds_the_optimizer_state(data_dir, tmp_path):
    # Rank 0 alone restores the momentum; the broadcast then steps the other ranks' fresh
    # optimizer to make its state, which must not start an allreduce that rank 0 never joins.
    # Resumed from one checkpoint (the paths' epochs are bitwise alike: test_every_model and the
    # fp16 test above), one allreduce and the hooks end with the same weights.
    stopped = tmp_path / "stopped"
    assert_ok(run_horovod(2, common_args(data_dir, stopped, "--grad-allreduce", "one", "--warmup-epochs", 0,
                                         "--stop-at", 1, epochs=2)))
    for path in ("one", "hooks"):
        shutil.copytree(stopped, tmp_path / path)
        args = common_args(data_dir, tmp_path / path, "--grad-allreduce", path, "--warmup-epochs", 0, epochs=2)
        assert_ok(run_horovod(2, [*args, "--resume"], timeout=120))
    assert_states_equal(load_ckpt(tmp_path / "one" / "ckpt.pth")["model"],
                        load_ckpt(tmp_path / "hooks" / "ckpt.pth")["model"], "one allreduce and the hooks")
    assert len(read_metrics(tmp_path / "one")) == 2


def test_twin_diff_is_only_the_port():
    # Joining, placing, the world's sums and LR scale, broadcasting and the optimizer wrapper.
    assert_the_diff_is_the_port("main_horovod.py", "# Horovod:")
    for f in ("main_elastic.py", "main_sweep.py"):
        assert not [ln for ln in open(os.path.join(ROOT, f)).read().splitlines() if len(ln) > 100], f


def test_target_accuracy_at_np2(np2_run, data_dir, tmp_path):
    ck, _, _ = np2_run
    rows = read_metrics(ck)
    target = float(rows[0]["test_acc"])
    # The same np=2 run (bitwise on the CPU) with epoch 1's accuracy as its target stops there.
    fresh = tmp_path / "fresh"
    r = assert_ok(run_horovod(2, common_args(data_dir, fresh, "--warmup-epochs", 1, "--target-acc", target,
                                             epochs=2)))
    want = 1
    assert [x["epoch"] for x in read_metrics(fresh)] == ["1"]
    said = [ln for ln in r.stdout.splitlines() if "target test accuracy" in ln]
    assert len(said) == 1 and f"reached at epoch {want} after" in said[0], r.stdout[-2000:]
    # A resume whose history already reached it: tests/test_main.py, the same loop code; a target
    # not reached is the run log's to say (tests/test_runlog.py).


def test_evaluation_with_more_ranks_than_test_images_is_exact(np2_run, tmp_path):
    # --synthetic-size 10: two test images over 3 ranks, shards of 1, 1 and 0 (padding, as
    # DistributedSampler does, would count 3; the same utils.evaluate runs after every epoch).
    ck, _, _ = np2_run
    args = ["--evaluate", "--checkpoint", ck / "ckpt.pth", "--data-dir", tmp_path / "data", "--dataset", "synthetic",
            "--synthetic-size", 10, "--arch", "lenet", "--batch-size", 2, "--checkpoint-dir", tmp_path / "ck"]
    r = assert_ok(run_horovod(3, args))
    three = parse_eval(last_line(r.stdout).split(":", 1)[-1])  # a launcher may prefix "[0]<stdout>:"
    one = parse_eval(last_line(assert_ok(run_main(args)).stdout))  # the same checkpoint and images
    assert three[1:] == one[1:] and one[2] == 2, (three, one)  # each image counted once
    assert abs(three[0] - one[0]) <= 1e-6 * abs(one[0]), (three, one)  # the loss up to summation order


def test_horovods_threads_get_the_cores_spare_time(data_dir, tmp_path):
    # np=1 on 2 cores: the rank computes with 2 torch threads (main and a pool worker), which
    # keep the normal policy; the threads hvd.init() started run only in the time left over.
    import os
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 usable cores for a torch thread pool beside the main thread")
    assert_ok(run_horovod(1, common_args(data_dir, tmp_path / "ck", epochs=1), probe=tmp_path,
                          env_extra={"HOROVOD_ELASTIC": "1"}))
    rank = load_ranks(tmp_path, 1)[0]
    policies = rank["policies"]
    assert rank["torch_threads"] == 2 and policies[rank["main_thread"]] == os.SCHED_OTHER
    idle = [t for t, p in policies.items() if p == os.SCHED_IDLE]
    normal = [t for t, p in policies.items() if p == os.SCHED_OTHER]
    assert idle, policies  # Horovod's background thread at least
    assert len(normal) >= rank["torch_threads"], policies  # the compute threads are not among them


@pytest.mark.parametrize("lever", ["normal priority", "three groups"])
def test_the_allreduce_levers_leave_the_weights_bitwise_equal(np2_run, data_dir, tmp_path, lever):
    # With two ranks every reduced element is a + b whichever way the gradients are fused, grouped
    # or scheduled, so the weights must equal the default run's bit for bit; a lever that dropped,
    # repeated or mismatched a gradient would not.
    ck, _, _ = np2_run
    args = common_args(data_dir, tmp_path / "ck", "--warmup-epochs", 1, epochs=2)
    if lever == "normal priority":  # Horovod's threads as they ran before share_cores(spare=...)
        cmd = horovod_cmd(2, args)
        at = cmd.index(PY) + 1
        cmd[at:at + 1] = ["-m", "benchmarks.diagnostics.normal_priority"]
    else:
        cmd = horovod_cmd(2, [*args, "--allreduce-groups", 3])
    assert_ok(run(cmd))
    assert_states_equal(load_ckpt(tmp_path / "ck" / "ckpt.pth")["model"], load_ckpt(ck / "ckpt.pth")["model"],
                        f"{lever} and the defaults")
