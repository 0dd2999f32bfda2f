"""utils.py in process: the LR schedule, host syncs in the step loop, BatchNorm replacement."""
import contextlib
import math

import pytest
import torch

from helpers import parse
from training.run import checkpoints, loaders
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
    optimizer = utils.make_optimizer(model, args)
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


def test_profile_steps_beyond_the_epoch_still_reports(capsys):
    # 80 images at batch 8 are 10 steps; asking for 50 profiles all 10 and says so.
    args = parse("--arch", "lenet", "--batch-size", "8", "--log-interval", "1000", "--profile-steps", "50")
    images = torch.randint(0, 256, (80, 3, 32, 32), dtype=torch.uint8)
    loader = loaders.DeviceLoader(images, torch.arange(80) % 10, 8, train=True)
    model = utils.build_model(args, torch.device("cpu"))
    optimizer = utils.make_optimizer(model, args)
    utils.train_epoch(model, loader, optimizer, utils.make_scaler(args, torch.device("cpu")),
                      utils.LRSchedule(0.1, 0, 10), 0, args, profile=True)
    out = capsys.readouterr().out
    assert "profile: median ms per step over 10 steps" in out, out


def test_schedule_state_round_trips():
    s = utils.LRSchedule(0.1, 0, 100, scale=4)
    s.load_state_dict({"base_lr": 0.01, "start_epoch": 50})
    assert s.state_dict() == {"base_lr": 0.01, "start_epoch": 50}
    assert s(50) == pytest.approx(0.04) and s.scale == 4  # the world's scale is not state


def test_onecycle_rises_per_step_to_the_peak_then_falls_to_zero():
    s = utils.LRSchedule(0.4, 0, 10, shape="onecycle", peak=0.2)  # the peak a fifth of the way: epoch 2
    assert s(0) == 0 and s(1) == pytest.approx(0.2) and s(1.5) == pytest.approx(0.3)  # per step
    assert s(2) == pytest.approx(0.4) and s(6) == pytest.approx(0.2) and s(10) == 0
    resumed = utils.LRSchedule(0.1, 5, 10, shape="onecycle", peak=0.2)  # --resume --lr 0.1 after epoch 5
    assert resumed(5) == 0 and resumed(6) == pytest.approx(0.1) and resumed(8) == pytest.approx(0.05)


def test_fast_recipe_takes_the_published_changes_and_flags_keep_their_own():
    fast = parse("--recipe", "fast")
    assert (fast.lr_schedule, fast.nesterov, fast.cutout, fast.label_smoothing, fast.batch_size) == \
        ("onecycle", True, 8, 0.2, 512)
    assert utils.make_optimizer(torch.nn.Linear(2, 2), fast).defaults["nesterov"] is True
    mine = parse("--recipe", "fast", "--no-nesterov", "--cutout", "0", "--lr-schedule", "cosine")
    assert (mine.nesterov, mine.cutout, mine.lr_schedule) == (False, 0, "cosine")
    plain = parse()
    assert (plain.lr_schedule, plain.nesterov, plain.cutout, plain.tta) == ("cosine", False, 0, False)
    assert utils.make_optimizer(torch.nn.Linear(2, 2), plain).defaults["nesterov"] is False


def test_tta_averages_the_mirrored_and_shifted_views():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(10))
    x = torch.randn(5, 3, 8, 8)
    model(x)
    padded = torch.nn.functional.pad(x, (1, 1, 1, 1), mode="reflect")
    views = [x, padded[..., :8, :8], padded[..., 2:, 2:]]
    mirrored = [(model(v) + model(v.flip(-1))) / 2 for v in views]
    want = mirrored[0] / 2 + (mirrored[1] + mirrored[2]) / 4
    assert torch.allclose(utils.tta_logits(model, x), want, atol=1e-6)
    assert not torch.allclose(want, model(x), atol=1e-3)  # the views differ from the image alone


def test_compiled_model_runs_full_batches_compiled_and_the_last_one_as_it_is():
    args = parse("--arch", "lenet", "--batch-size", "8", "--compile")
    model = utils.build_model(args, torch.device("cpu"))
    train_model = utils.training_model(args, model, utils.make_optimizer(model, args))
    called = []

    class Graph(torch.nn.Module):  # stands in for the compiled graph, and counts its calls
        def forward(self, x):
            called.append(len(x))
            return model(x)
    assert isinstance(train_model.compiled, torch._dynamo.eval_frame.OptimizedModule)
    train_model.compiled = Graph()
    small = torch.randn(3, 3, 32, 32)
    assert torch.equal(train_model(small), model(small)) and called == []
    train_model(torch.randn(8, 3, 32, 32))
    assert called == [8]
    assert checkpoints.unwrap(train_model) is model
    assert {id(p) for p in train_model.parameters()} == {id(p) for p in model.parameters()}


def test_a_ports_wrapper_is_what_is_compiled_and_gets_no_sync():
    """DDP's port wraps before compiling (so Dynamo sees DDP and splits at its buckets), and
    --batches-per-allreduce reaches the wrapper's no_sync through FullBatchesCompiled."""
    args = parse("--arch", "lenet", "--batch-size", "8", "--compile")
    model = utils.build_model(args, torch.device("cpu"))
    held = []

    class Wrapper(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, x):
            return self.module(x)

        def no_sync(self):
            held.append(True)
            return contextlib.nullcontext()
    train_model = utils.training_model(args, model, utils.make_optimizer(model, args), wrap=Wrapper)
    assert isinstance(train_model.model, Wrapper) and train_model.compiled._orig_mod is train_model.model
    with train_model.no_sync():
        pass
    assert held == [True] and checkpoints.unwrap(train_model).module is model
