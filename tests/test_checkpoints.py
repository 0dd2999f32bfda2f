"""checkpoints.py in process: the saves, the pytorch-cifar mapping, what restore() loads, and its checks."""
import os
import re
import subprocess

import pytest
import torch

from helpers import parse, probe_cmd
from training.base.errors import TrainerError, UsageError
from training.run import checkpoints, rundir
import utils


def test_pytorch_cifar_checkpoint_mapping():
    sd = {"module.conv1.weight": torch.zeros(1)}
    ck = checkpoints.as_trainer_checkpoint({"net": sd, "acc": 93.5, "epoch": 199}, "x.pth")
    assert ck["model"] == {"conv1.weight": sd["module.conv1.weight"]}
    assert ck["epoch"] == 200 and ck["best_acc"] == pytest.approx(0.935)
    with pytest.raises(TrainerError, match="neither"):
        checkpoints.as_trainer_checkpoint({"weights": 1}, "x.pth")


def _args(*argv):
    return parse("--arch", "lenet", *argv)


@pytest.fixture
def saved(tmp_path):
    """A checkpoint after one step of LeNet, so the optimizer holds momentum buffers."""
    args = _args("--checkpoint-dir", str(tmp_path), "--epochs", "4")
    model = utils.build_model(args, torch.device("cpu"))
    optimizer = utils.make_optimizer(model, args)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    optimizer.step()
    schedule = utils.LRSchedule(0.05, 0, 4)
    scaler = utils.make_scaler(args, torch.device("cpu"))
    state = checkpoints.checkpoint_state(args, model, optimizer, scaler, schedule, 2, 0.5, 1, [])
    checkpoints.save_checkpoint(str(tmp_path / "ckpt.pth"), state)
    return tmp_path, state


def _fresh(args):
    model = utils.build_model(args, torch.device("cpu"))
    return model, utils.make_optimizer(model, args)


def test_checkpoint_names_the_schedule_and_its_format(saved):
    _, state = saved
    assert state["format"] == checkpoints.FORMAT == 2
    assert state["schedule"] == {"base_lr": 0.05, "start_epoch": 0} and "scheduler" not in state


def test_format_1_checkpoints_still_resume_their_schedule(saved):
    folder, state = saved
    old = dict(state, format=1, scheduler=state.pop("schedule"))
    checkpoints.save_checkpoint(str(folder / "ckpt.pth"), old)
    args = _args("--checkpoint-dir", str(folder), "--epochs", "4", "--resume")
    start = checkpoints.restore(args, *_fresh(args))
    assert start.schedule == {"base_lr": 0.05, "start_epoch": 0} and start.epoch == 2


def test_resume_loads_the_optimizer_and_evaluate_does_not(saved):
    folder, _ = saved
    args = _args("--checkpoint-dir", str(folder), "--epochs", "4", "--resume")
    model, optimizer = _fresh(args)
    assert checkpoints.restore(args, model, optimizer).optimizer_state is True
    assert optimizer.state  # momentum buffers are back
    args = _args("--checkpoint-dir", str(folder), "--evaluate")
    model, optimizer = _fresh(args)
    start = checkpoints.restore(args, model, optimizer)
    assert start.optimizer_state is False and not optimizer.state  # nothing to broadcast
    assert start.epoch == 2  # the weights are loaded all the same


def test_resume_with_stop_at_not_after_the_checkpoint_is_a_usage_error(saved):
    folder, _ = saved
    for stop in (1, 2):
        args = _args("--checkpoint-dir", str(folder), "--epochs", "4", "--resume", "--stop-at", str(stop))
        with pytest.raises(UsageError, match=f"--stop-at {stop} is not after the checkpoint's epoch 2"):
            checkpoints.restore(args, *_fresh(args))
    args = _args("--checkpoint-dir", str(folder), "--epochs", "4", "--resume", "--stop-at", "3")
    assert checkpoints.restore(args, *_fresh(args)).epoch == 2


def test_a_new_lr_on_a_finished_run_is_told_the_total_epochs_to_give(saved):
    # pytorch-cifar's `--resume --lr 0.01` trains another schedule; here --epochs is the total, so
    # the refusal names the flag that trains on, and with it the resume starts a new cosine.
    folder, _ = saved
    args = _args("--checkpoint-dir", str(folder), "--epochs", "2", "--resume", "--lr", "0.01")
    with pytest.raises(UsageError, match=r"already finished 2 of --epochs 2; .*\(--epochs 52 trains 50 more\)"):
        checkpoints.restore(args, *_fresh(args))
    args = _args("--checkpoint-dir", str(folder), "--epochs", "52", "--resume", "--lr", "0.01")
    assert checkpoints.restore(args, *_fresh(args)).schedule == {"base_lr": 0.01, "start_epoch": 2}


def test_resume_says_what_it_continues(saved, capsys):
    folder, _ = saved
    path = folder / "ckpt.pth"
    for flags, schedule in (
            [[], "the saved cosine (lr 0.05 from epoch 0) continues over the 8 epochs 3-10"],
            [["--lr", "0.01"], "--lr 0.01 restarts the cosine over the 8 epochs 3-10"],
            [["--lr", "0.01", "--epochs", "3"], "--lr 0.01 restarts the cosine over epoch 3"],
            [["--lr-schedule", "onecycle"],
             "the saved one-cycle (lr 0.05 from epoch 0) continues over the 8 epochs 3-10"]):
        args = _args("--checkpoint-dir", str(folder), "--epochs", "10", "--resume", *flags)
        checkpoints.restore(args, *_fresh(args))
        said = capsys.readouterr().out.splitlines()
        assert said == [f"resuming {path} after epoch 2, best test acc 0.5000; {schedule}"]
    args = _args("--checkpoint-dir", str(folder), "--evaluate")
    checkpoints.restore(args, *_fresh(args))
    assert capsys.readouterr().out == ""  # --evaluate resumes nothing


def test_restore_says_nothing_where_not_verbose(saved, capsys):
    folder, _ = saved
    args = _args("--checkpoint-dir", str(folder), "--epochs", "10", "--resume")
    assert checkpoints.restore(args, *_fresh(args), reports=False).epoch == 2
    assert capsys.readouterr().out == ""


def test_unwrap_strips_ddp_and_compile():
    import torch.distributed as dist
    model = torch.nn.Linear(2, 2)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
        assert checkpoints.unwrap(wrapped) is model
        assert list(checkpoints.unwrap(wrapped).state_dict()) == ["weight", "bias"]
    finally:
        dist.destroy_process_group()
    assert checkpoints.unwrap(torch.compile(model)) is model


def test_save_writes_last_and_best_on_the_reporting_rank_only(saved, tmp_path):
    _, state = saved
    args = _args("--checkpoint-dir", str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    checkpoints.save(args, state, is_best=True, reports=False)
    assert os.listdir(tmp_path / "run") == []
    checkpoints.save(args, dict(state, epoch=3), is_best=False, reports=True)
    assert os.listdir(tmp_path / "run") == [checkpoints.LAST]
    checkpoints.save(args, dict(state, epoch=4), is_best=True, reports=True)
    assert sorted(os.listdir(tmp_path / "run")) == sorted([checkpoints.LAST, checkpoints.BEST])
    assert torch.load(tmp_path / "run" / checkpoints.BEST, weights_only=True)["epoch"] == 4


def test_auto_resume_continues_the_saved_schedule_whatever_lr_says(saved):
    # The same command starts a job and every restart: --lr is the fresh start's, and a restart
    # must not begin a new cosine at whatever epoch it was stopped.
    folder, _ = saved
    args = _args("--checkpoint-dir", str(folder), "--epochs", "4", "--auto-resume", "--lr", "0.3")
    start = checkpoints.restore(args, *_fresh(args), reports=False)
    assert start.epoch == 2 and start.schedule == {"base_lr": 0.05, "start_epoch": 0}
    fresh = _args("--checkpoint-dir", str(folder / "empty"), "--epochs", "4", "--auto-resume", "--lr", "0.3")
    assert checkpoints.restore(fresh, *_fresh(fresh)).schedule == {"base_lr": 0.3, "start_epoch": 0}


def test_an_unreadable_checkpoint_names_its_real_cause(saved, tmp_path):
    """A file cut short is truncated; a whole file torch.load cannot read (here a zip archive that
    is not a checkpoint) is named as that, with the PyTorch that could not read it."""
    folder, _ = saved
    blob = (folder / "ckpt.pth").read_bytes()
    (tmp_path / "cut.pth").write_bytes(blob[:len(blob) // 3])
    with pytest.raises(TrainerError, match="is truncated or corrupt"):
        checkpoints.load_checkpoint(str(tmp_path / "cut.pth"))
    import zipfile
    with zipfile.ZipFile(tmp_path / "other.pth", "w") as z:
        z.writestr("notes.txt", "not a checkpoint")
    with pytest.raises(TrainerError, match=rf"PyTorch {re.escape(torch.__version__)} cannot read checkpoint"):
        checkpoints.load_checkpoint(str(tmp_path / "other.pth"))


def test_a_fresh_run_on_a_held_folder_is_told_it_is_in_use_not_that_its_checkpoint_exists(saved):
    # The holder has already written ckpt.pth: the in-use refusal still comes first, whichever
    # of two runs started together reaches preflight after the other's first epoch.
    folder, _ = saved
    args = _args("--checkpoint-dir", str(folder))
    with pytest.raises(UsageError, match="already exists; pass --resume"):
        rundir.preflight(args, reports=True)
    holder = subprocess.Popen(probe_cmd("holder", folder / rundir.HOLDER), stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(TrainerError, match="is in use by another run") as refused:
            rundir.preflight(args, reports=True)
        assert type(refused.value) is TrainerError and f"process {holder.pid}" in str(refused.value)
        rundir.preflight(_args("--checkpoint-dir", str(folder), "--overwrite"), reports=True)
    finally:
        holder.kill()
        holder.wait()
