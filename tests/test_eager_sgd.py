"""training/ports/eager_sgd.py: torch's SGD updates, bit for bit, without importing torch._dynamo."""
import subprocess
import sys

import torch

from helpers import ROOT, parse
import models
from training.ports import eager_sgd
import utils


def steps(make, nesterov):
    """Three SGD steps of LeNet on fixed batches from a fixed start, a state_dict round trip
    between them: (weights, optimizer state)."""
    torch.manual_seed(0)
    model = models.get_model("lenet", num_classes=10)
    opt = make(model.parameters(), lr=0.1, momentum=0.9, nesterov=nesterov, weight_decay=5e-4, fused=True)
    g = torch.Generator().manual_seed(1)
    for i in range(3):
        x, y = torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if i == 1:
            opt.load_state_dict(opt.state_dict())
    return model.state_dict(), opt.state_dict()


def test_the_updates_are_torchs_bit_for_bit():
    for nesterov in (False, True):
        mine, theirs = steps(eager_sgd.sgd, nesterov), steps(torch.optim.SGD, nesterov)
        assert all(torch.equal(mine[0][k], theirs[0][k]) for k in theirs[0])
        assert mine[1]["param_groups"] == theirs[1]["param_groups"]
        for i, s in theirs[1]["state"].items():
            assert torch.equal(mine[1]["state"][i]["momentum_buffer"], s["momentum_buffer"])


def test_a_trainers_optimizer_starts_steps_and_saves_without_the_compiler():
    # A fresh process, as a trainer is: the optimizer utils.make_optimizer gives a run without
    # --compile, through everything a run does with it, then torch._dynamo must not be loaded.
    # This fails where the installed torch wraps its optimizer's methods another way (then
    # eager_sgd falls back to torch.optim.SGD, which imports it).
    code = """
import sys, torch
from helpers import parse
import models, utils
model = models.get_model("lenet", num_classes=10)
opt = utils.make_optimizer(model, parse())
opt.zero_grad()
torch.nn.functional.cross_entropy(model(torch.randn(2, 3, 32, 32)), torch.tensor([1, 2])).backward()
opt.step()
opt.load_state_dict(opt.state_dict())
print(type(opt).__name__, "torch._dynamo" in sys.modules)
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": f"{ROOT}:{ROOT}/tests", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["EagerSGD", "False"], r.stdout


def test_a_compiled_run_and_a_differentiable_sgd_get_torchs_own():
    model = models.get_model("lenet", num_classes=10)
    assert type(utils.make_optimizer(model, parse("--compile"))) is torch.optim.SGD
    assert type(eager_sgd.sgd(model.parameters(), lr=0.1, differentiable=True)) is torch.optim.SGD
