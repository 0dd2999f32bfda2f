"""recipe.py in process: the recipes, the defaults they give the flags, and that every
hyperparameter the engine uses comes from the chosen recipe or a flag."""
import pytest
import torch

from helpers import parse
from training.base import recipe
from training.base.recipe import RECIPE, RECIPES
from training.run import checkpoints, cli
import utils


def test_defaults_are_pytorch_cifars_recipe():
    # kuangliu/pytorch-cifar's main.py: SGD LR 0.1, momentum 0.9, weight decay 5e-4, batch 128,
    # 200 epochs of cosine annealing, crop padding 4; the ports add a 5-epoch warm-up.
    assert RECIPE == dict(lr=0.1, lr_schedule="cosine", onecycle_peak=0.2, momentum=0.9, nesterov=False,
                          weight_decay=5e-4, batch_size=128, epochs=200, crop_padding=4, cutout=0,
                          warmup_epochs=5, label_smoothing=0.0)
    args = parse(port="horovod")
    assert (args.epochs, args.batch_size, args.warmup_epochs, args.label_smoothing, args.weight_decay) == \
        (200, 128, 5, 0, 5e-4)
    assert args.lr is None  # fresh runs take the recipe's 0.1; a resume keeps the saved schedule
    assert "default: 0.1 on a fresh run" in " ".join(cli.build_parser("").format_help().split())
    assert args.recipe == "pytorch-cifar"


def test_recipe_fast_sets_the_defaults_and_flags_still_win():
    assert RECIPES["fast"] == dict(RECIPE, lr=0.4, lr_schedule="onecycle", nesterov=True, batch_size=512,
                                   epochs=40, label_smoothing=0.2, cutout=8)
    args = parse("--recipe", "fast")
    assert (args.epochs, args.batch_size, args.label_smoothing) == (40, 512, 0.2)
    args = parse("--recipe", "fast", "--epochs", "7", "--batch-size", "64", "--label-smoothing", "0")
    assert (args.epochs, args.batch_size, args.label_smoothing) == (7, 64, 0)


def test_every_hyperparameter_comes_from_the_chosen_recipe_or_a_flag(monkeypatch):
    """A recipe changed here reaches the optimizer, the loader and the schedule, through the
    flags' defaults and through what the engine reads of the recipe itself."""
    changed = dict(recipe.RECIPE, momentum=0.5, weight_decay=1e-3, nesterov=True, crop_padding=2,
                   lr_schedule="onecycle", onecycle_peak=0.5, batch_size=16, lr=0.3, warmup_epochs=0)
    monkeypatch.setitem(recipe.RECIPES, "pytorch-cifar", changed)
    args = parse("--arch", "lenet", "--epochs", "10")
    model = utils.build_model(args, torch.device("cpu"))
    sgd = utils.make_optimizer(model, args).defaults
    assert (sgd["momentum"], sgd["weight_decay"], sgd["nesterov"]) == (0.5, 1e-3, True)
    images = torch.zeros(32, 3, 32, 32, dtype=torch.uint8)
    train, _ = utils.make_loaders(args, (images, torch.zeros(32, dtype=torch.long)),
                                  (images, torch.zeros(32, dtype=torch.long)), torch.device("cpu"))
    assert train.pad == 2 and train.batch_size == 16
    schedule = utils.make_schedule(args, checkpoints.fresh_start(args).schedule)
    assert schedule(5) == pytest.approx(0.3) and schedule(2.5) == pytest.approx(0.15)  # the peak halfway
    # ...and a flag given keeps its own value
    flagged = parse("--arch", "lenet", "--weight-decay", "0", "--no-nesterov")
    assert utils.make_optimizer(model, flagged).defaults["weight_decay"] == 0
    assert utils.make_optimizer(model, flagged).defaults["nesterov"] is False
