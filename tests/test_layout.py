"""layout.py: channels_last weights, and Horovod's collectives that take contiguous tensors only.

In process for the layout helpers; the gradient hook path of DistributedOptimizer in a
fresh process (HOROVOD_ELASTIC=1 makes it register its hooks at np=1, as it does at every
np >= 2). The np=2 family with --channels-last is in test_channels_last.py.
"""
import subprocess

import pytest
import torch

from helpers import env, parse, probe_cmd
from training.base import layout

CL = torch.channels_last


def test_grad_layout_hands_horovod_a_contiguous_view_without_copying():
    class Fp16:  # Horovod's fp16 compressor, as its interface goes
        @staticmethod
        def compress(t):
            return t.half(), t.dtype

        @staticmethod
        def decompress(t, dtype):
            return t.to(dtype)

    grad = torch.randn(8, 3, 5, 5).contiguous(memory_format=CL)
    assert not grad.is_contiguous()  # what Horovod refuses
    plain = layout.GradLayout(type("None_", (), {"compress": staticmethod(lambda t: (t, None)),
                                                 "decompress": staticmethod(lambda t, c: t)}))
    sent, ctx = plain.compress(grad)
    assert sent.is_contiguous() and sent.data_ptr() == grad.data_ptr()  # the same bytes
    sent.mul_(2)  # an in-place allreduce
    back = plain.decompress(sent, ctx)
    assert back.shape == grad.shape and back.stride() == grad.stride() and back.data_ptr() == grad.data_ptr()
    half, ctx = layout.GradLayout(Fp16).compress(grad)
    assert half.is_contiguous() and half.dtype == torch.float16
    restored = layout.GradLayout(Fp16).decompress(half, ctx)
    assert restored.shape == grad.shape and torch.allclose(restored, grad, rtol=1e-3, atol=1e-3)
    bias = torch.randn(8)
    assert plain.compress(bias)[0] is bias  # contiguous tensors pass as they are


def test_channels_last_keeps_parameters_and_converts_momentum():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                                torch.nn.LazyLinear(2))
    model(torch.randn(2, 3, 8, 8))
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    optimizer.step()
    layout.channels_last(model, optimizer)
    assert list(model.parameters()) == params  # the same objects: hooks and optimizer still hold them
    conv = model[0].weight
    assert conv.is_contiguous(memory_format=CL) and not conv.is_contiguous()
    assert optimizer.state[conv]["momentum_buffer"].is_contiguous(memory_format=CL)
    assert layout.is_channels_last(model)
    with layout.contiguous(model, optimizer):
        assert conv.is_contiguous() and optimizer.state[conv]["momentum_buffer"].is_contiguous()
    assert not conv.is_contiguous()  # back in channels_last


def test_checkpoint_state_is_layout_free():
    w = torch.randn(4, 3, 3, 3)
    state = layout.contiguous_state({"model": {"w": w.contiguous(memory_format=CL), "b": torch.ones(4)},
                                     "optimizer": {"state": {0: {"momentum_buffer": w.contiguous(
                                         memory_format=CL)}}, "param_groups": [{"params": [0]}]}})
    assert state["model"]["w"].is_contiguous() and torch.equal(state["model"]["w"], w)
    assert state["optimizer"]["state"][0]["momentum_buffer"].is_contiguous()
    assert state["optimizer"]["param_groups"] == [{"params": [0]}]


@pytest.mark.parametrize("flag, default", [(None, False), ("--channels-last", True),
                                           ("--no-channels-last", False)])
def test_flag_defaults_to_the_device(flag, default):
    args = parse(*([flag] if flag else []))
    assert layout.use_channels_last(args, torch.device("cpu")) is default
    if flag is None:
        assert layout.use_channels_last(args, torch.device("cuda")) is True


def test_gradient_hooks_allreduce_channels_last_gradients():
    # HOROVOD_ELASTIC=1: DistributedOptimizer registers its hooks at np=1 as at np >= 2.
    run = probe_cmd("grad_hooks")
    r = subprocess.run([*run, "layout"], env=env({"HOROVOD_ELASTIC": "1"}), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    fired, params, grad_cl, moved = r.stdout.split()
    assert fired == params and int(params) == 62  # every ResNet-18 weight's hook, during backward
    assert grad_cl == "True" and moved == "True"
    # Without GradLayout the same step fails as it did on the H100.
    r = subprocess.run([*run, "plain"], env=env({"HOROVOD_ELASTIC": "1"}), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "Tensor is required to be contiguous" in r.stderr


def test_fp16_steps_through_horovod_read_nothing_back():
    # hvd.DistributedOptimizer re-runs SGD.__init__ without fused=True; distributed_optimizer
    # keeps the fused step's flag, so GradScaler hands found_inf to the step instead of reading
    # it (on a GPU, one host sync a step).
    r = subprocess.run(probe_cmd("fp16_steps"), env=env({"HOROVOD_ELASTIC": "1"}), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["True", "0", "True"]
