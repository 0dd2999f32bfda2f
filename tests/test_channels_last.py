"""The Horovod np=2 family with --channels-last, on the CPU: the GPU's layout, tested where CI runs.

On a GPU the model trains in channels_last by default, and Horovod's collectives refuse
its weights, gradients and momentum buffers as they are (layout.py). The CPU runs the same
layout with --channels-last, so every collective the port makes is exercised here: the
start-up broadcasts, the gradient allreduce (plain, fp16, accumulated; Adasum's is in
test_main_horovod.py's Adasum run), the
optimizer-state broadcast of a resume, and the elastic state sync.
"""
import os
import shutil

import pytest

from helpers import (
    BIN,
    PY,
    ROOT,
    assert_ok,
    assert_ranks_identical,
    common_args,
    last_line,
    load_ckpt,
    load_ranks,
    parse_eval,
    read_metrics,
    run,
    run_horovod,
    run_main,
    without_lr,
)

CL = "--channels-last"


def ranks_identical(probe, size=2):
    """The probed ranks, after checking that they ended identical."""
    ranks = load_ranks(probe, size)
    assert_ranks_identical(ranks)
    return ranks


@pytest.fixture(scope="module")
def cl_run(data_dir, tmp_path_factory):
    """np=2 under mpirun, channels_last, 1 of 2 epochs: resumed below."""
    ck = tmp_path_factory.mktemp("cl")
    probe = tmp_path_factory.mktemp("cl-probe")
    assert_ok(run_horovod(2, common_args(data_dir, ck, CL, "--warmup-epochs", 0, "--stop-at", 1), probe=probe))
    return ck, probe


def test_training_ranks_identical_gloo(cl_run):
    ck, probe = cl_run
    ranks = ranks_identical(probe)
    assert any(v.dim() == 4 for v in ranks[0]["model"].values())  # LeNet has conv weights to lay out
    saved = load_ckpt(ck / "ckpt.pth")
    assert all(v.is_contiguous() for v in saved["model"].values())  # layout-free checkpoint
    assert all(s["momentum_buffer"].is_contiguous() for s in saved["optimizer"]["state"].values())


def test_resume_broadcasts_momentum_under_mpirun(cl_run, data_dir, tmp_path):
    # Rank 0 loads the momentum buffers and broadcasts them before the weights go
    # channels_last; the gradient allreduce then runs on channels_last gradients.
    ck, _ = cl_run
    shutil.copytree(ck, tmp_path / "ck")
    assert_ok(run_horovod(2, without_lr(common_args(data_dir, tmp_path / "ck", CL, "--resume",
                                                    "--warmup-epochs", 0)), "mpirun", probe=tmp_path))
    ranks_identical(tmp_path)
    assert [r["epoch"] for r in read_metrics(tmp_path / "ck")] == ["1", "2"]


def test_fp16_allreduce_and_batches_per_allreduce(data_dir, tmp_path):
    assert_ok(run_horovod(2, common_args(data_dir, tmp_path / "ck", CL, "--fp16-allreduce",
                                         "--batches-per-allreduce", 2, "--warmup-epochs", 0, epochs=1),
                          probe=tmp_path))
    ranks_identical(tmp_path)


def test_elastic_state_sync(data_dir, tmp_path):
    # Every elastic start syncs the state by broadcasting model and optimizer: in
    # channels_last that needs the contiguous window of ElasticState.sync.
    slots = tmp_path / "slots"
    slots.write_text("2\n")
    cmd = [os.path.join(BIN, "horovodrun"), "-np", "2", "--min-np", "2", "--max-np", "2",
           "--host-discovery-script", f"{os.path.join(ROOT, 'scripts', 'discover_hosts.sh')} {slots}",
           "--network-interface", "lo", PY, "main_elastic.py",
           *common_args(data_dir, tmp_path / "el", CL, "--warmup-epochs", 0, epochs=1)]
    r = assert_ok(run(cmd, timeout=150))
    assert [(x["epoch"], x["world_size"]) for x in read_metrics(tmp_path / "el")] == [("1", "2")], r.stdout


def test_checkpoint_evaluates_the_same_in_either_layout(cl_run, data_dir):
    ck, _ = cl_run
    lines = []
    for flag in (CL, "--no-channels-last"):
        r = assert_ok(run_main(["--evaluate", *common_args(data_dir, ck, flag)]))
        lines.append(parse_eval(last_line(r.stdout)))
    assert lines[0][2] == 100 and lines[0][1] == lines[1][1]
    assert lines[0][0] == pytest.approx(lines[1][0], rel=1e-5)
