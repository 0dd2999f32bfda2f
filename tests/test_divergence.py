"""divergence.py in process: what stops a run, and the line it stops with. Its runs under every
launcher (each rank stopping alike, nothing of the epoch saved) are in test_reliability.py."""
import math

import pytest
import torch

from training.base.errors import Diverged
from training.run import divergence
import utils


def test_a_non_finite_training_loss_stops_and_says_where():
    divergence.check_training_loss(2.3, 0, 0.1, 10, 10)  # finite: nothing happens
    with pytest.raises(Diverged, match=r"epoch 3 \(step 5 of 10\): the training loss became nan at LR 0.4"):
        divergence.check_training_loss(math.nan, 2, 0.4, 5, 10)
    with pytest.raises(Diverged, match=r"in epoch 3: the training loss became inf"):
        divergence.check_training_loss(math.inf, 2, 0.4, 10, 10)
    assert Diverged.exit_code == 3


def test_the_epoch_check_looks_at_the_test_loss_and_every_weight_and_buffer():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    train, fine = {"lr": 0.1}, {"loss": 1.0}
    divergence.check_epoch(model, train, fine, 0, utils.World())
    with pytest.raises(Diverged, match="the test loss became nan"):
        divergence.check_epoch(model, train, {"loss": math.nan}, 0, utils.World())
    with torch.no_grad():
        model[1].running_var[0] = math.inf  # a buffer, not a parameter
    with pytest.raises(Diverged, match="in epoch 1: the weights became non-finite"):
        divergence.check_epoch(model, train, fine, 0, utils.World())
