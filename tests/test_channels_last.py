"""The Horovod np=2 family with --channels-last, on the CPU: the GPU's layout, tested where CI runs.

On a GPU the model trains in channels_last by default, and Horovod's collectives refuse
its weights, gradients and momentum buffers as they are (layout.py). The CPU runs the same
layout with --channels-last, so every collective the port makes is exercised: here the
start-up broadcasts, the plain gradient allreduce and the optimizer-state broadcast of a
resume; in test_main_horovod.py the fp16 and accumulated allreduce and Adasum's; in
test_main_elastic.py the elastic state sync of a start and of a resume.
"""
import shutil

import pytest

from helpers import (
    assert_ok,
    assert_ranks_identical,
    common_args,
    last_line,
    load_ckpt,
    load_ranks,
    parse_eval,
    read_metrics,
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


def test_training_ranks_identical(cl_run):
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


def test_checkpoint_evaluates_the_same_in_either_layout(cl_run, data_dir):
    ck, _ = cl_run
    lines = []
    for flag in (CL, "--no-channels-last"):
        r = assert_ok(run_main(["--evaluate", *common_args(data_dir, ck, flag)]))
        lines.append(parse_eval(last_line(r.stdout)))
    assert lines[0][2] == 100 and lines[0][1] == lines[1][1]
    assert lines[0][0] == pytest.approx(lines[1][0], rel=1e-5)
