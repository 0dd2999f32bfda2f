"""utils.py in process: the LR schedule, host syncs in the step loop, BatchNorm replacement."""
import math

import pytest
import torch

from helpers import parse
from training import loaders
import utils


def test_cosine_schedule_per_epoch():
    s = utils.LRSchedule(0.1, 0, 200)
    assert s(0) == pytest.approx(0.1)
    assert s(100.7) == pytest.approx(0.05)  # stepped per epoch: the fraction is ignored
    assert s(199) == pytest.approx(0.1 * 0.5 * (1 + math.cos(math.pi * 199 / 200)))


def test_warmup_ramps_from_lr_to_lr_times_size():
    s = utils.LRSchedule(0.1, 0, 100, scale=4, warmup_epochs=5)
    assert s(0) == pytest.approx(0.1)  # starts at --lr
    assert s(2.5) == pytest.approx(0.25 * 0.5 * (1 + math.cos(math.pi * 2 / 100)))
    assert s(5) == pytest.approx(0.4 * 0.5 * (1 + math.cos(math.pi * 5 / 100)))  # then lr x size
    assert utils.LRSchedule(0.1, 0, 100, scale=1, warmup_epochs=5)(0) == pytest.approx(0.1)


def test_resume_with_new_lr_anneals_over_the_rest():
    s = utils.LRSchedule(0.01, 120, 200)
    assert s(120) == pytest.approx(0.01)
    assert s(160) == pytest.approx(0.005)
    assert s.state_dict() == {"base_lr": 0.01, "start_epoch": 120}


def _count_host_syncs(monkeypatch):
    """Count the Tensor methods that copy a value to the host (each a device sync on CUDA)."""
    calls = []
    for name in ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "cpu", "numpy"):
        orig = getattr(torch.Tensor, name)

        def counted(self, *a, _orig=orig, _name=name, **k):
            calls.append(_name)
            return _orig(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, counted)
    return calls


def test_training_step_loop_has_no_host_sync(monkeypatch):
    args = parse("--arch", "lenet", "--batch-size", "8", "--log-interval", "1000")
    torch.manual_seed(0)
    images = torch.randint(0, 256, (80, 3, 32, 32), dtype=torch.uint8)
    loader = loaders.DeviceLoader(images, torch.arange(80) % 10, 8, train=True)
    model = utils.build_model(args, torch.device("cpu"))
    optimizer = utils.make_optimizer(model)
    scaler = utils.make_scaler(args, torch.device("cpu"))
    schedule = utils.LRSchedule(0.1, 0, 10)
    calls = _count_host_syncs(monkeypatch)
    out = utils.train_epoch(model, loader, optimizer, scaler, schedule, 0, args, utils.World())
    assert len(loader) == 10
    assert calls == ["tolist"], "only the end-of-epoch reduction may read values back"
    assert out["images"] == 80
    # The instrument works: a log interval inside the epoch adds exactly its readings.
    calls.clear()
    args = parse("--arch", "lenet", "--batch-size", "8", "--log-interval", "5")
    utils.train_epoch(model, loader, optimizer, scaler, schedule, 1, args, utils.World())
    assert calls == ["tolist", "tolist"]


def test_replace_batchnorm_keeps_state():
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    net[1].running_mean.fill_(0.5)

    class MyBN(torch.nn.BatchNorm2d):
        pass
    utils.replace_batchnorm(net, MyBN)
    assert isinstance(net[1], MyBN) and torch.all(net[1].running_mean == 0.5)




def test_profile_steps_beyond_the_epoch_still_reports(capsys):
    # 80 images at batch 8 are 10 steps; asking for 50 profiles all 10 and says so.
    args = parse("--arch", "lenet", "--batch-size", "8", "--log-interval", "1000", "--profile-steps", "50")
    images = torch.randint(0, 256, (80, 3, 32, 32), dtype=torch.uint8)
    loader = loaders.DeviceLoader(images, torch.arange(80) % 10, 8, train=True)
    model = utils.build_model(args, torch.device("cpu"))
    optimizer = utils.make_optimizer(model)
    utils.train_epoch(model, loader, optimizer, utils.make_scaler(args, torch.device("cpu")),
                      utils.LRSchedule(0.1, 0, 10), 0, args, profile=True)
    out = capsys.readouterr().out
    assert "profile: median ms per step over 10 steps" in out, out


def test_schedule_state_round_trips():
    s = utils.LRSchedule(0.1, 0, 100, scale=4)
    s.load_state_dict({"base_lr": 0.01, "start_epoch": 50})
    assert s.state_dict() == {"base_lr": 0.01, "start_epoch": 50}
    assert s(50) == pytest.approx(0.04) and s.scale == 4  # the world's scale is not state
