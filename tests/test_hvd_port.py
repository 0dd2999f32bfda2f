"""training/ports/hvd_port.py: the settings Horovod starts with, the CPU's polled waits, Adasum's
limits (its runs are in test_main_horovod.py and test_channels_last.py), and the SyncBatchNorm
swap."""
import os

import pytest
import torch

from training.base.errors import UsageError
from training.ports import hvd_port


def test_adasum_needs_mpi_and_a_power_of_two():
    hvd_port.check(4, mpi_enabled=True)
    with pytest.raises(UsageError, match="MPI controller"):
        hvd_port.check(4, mpi_enabled=False)
    with pytest.raises(UsageError, match="power-of-two number of processes, not 3"):
        hvd_port.check(3, mpi_enabled=True)


def test_async_completion_and_a_short_cycle_are_given_on_cuda_only_and_never_over_the_users(monkeypatch):
    for name in ("HOROVOD_ENABLE_ASYNC_COMPLETION", "HOROVOD_CYCLE_TIME"):
        monkeypatch.delenv(name, raising=False)
    assert hvd_port.apply(cuda=False) == {}
    assert "HOROVOD_ENABLE_ASYNC_COMPLETION" not in os.environ and "HOROVOD_CYCLE_TIME" not in os.environ
    assert hvd_port.apply(cuda=True) == {"HOROVOD_ENABLE_ASYNC_COMPLETION": "1", "HOROVOD_CYCLE_TIME": "0.1"}
    assert os.environ["HOROVOD_ENABLE_ASYNC_COMPLETION"] == "1"
    for name in ("HOROVOD_ENABLE_ASYNC_COMPLETION", "HOROVOD_CYCLE_TIME"):
        monkeypatch.setenv(name, "0")
    assert hvd_port.apply(cuda=True) == {} and os.environ["HOROVOD_ENABLE_ASYNC_COMPLETION"] == "0"


def test_on_the_cpu_every_wait_for_a_collective_polls(monkeypatch):
    # Each module of Horovod's that holds synchronize gets the polled wait; the trainers' runs
    # (test_main_horovod.py, test_main_elastic.py) prove that it gives Horovod's results.
    import horovod.torch as hvd
    from horovod.torch import functions, mpi_ops, optimizer, sync_batch_norm
    modules = (mpi_ops, hvd, optimizer, functions, sync_batch_norm)
    native = getattr(mpi_ops.synchronize, "__wrapped__", mpi_ops.synchronize)
    for m in modules:  # Horovod's own, here and after the test
        monkeypatch.setattr(m, "synchronize", native)
    assert not any(getattr(m.synchronize, "polled", False) for m in modules)
    for name in ("HOROVOD_ENABLE_ASYNC_COMPLETION", "HOROVOD_CYCLE_TIME"):
        monkeypatch.delenv(name, raising=False)  # what apply(cuda=True) sets goes with the test
    hvd_port.apply(cuda=True)
    assert not any(getattr(m.synchronize, "polled", False) for m in modules)
    hvd_port.apply(cuda=False)
    waits = {m.synchronize for m in modules}
    assert len(waits) == 1 and waits.pop().polled


def test_replace_batchnorm_keeps_state():
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    net[1].running_mean.fill_(0.5)

    class MyBN(torch.nn.BatchNorm2d):
        pass
    hvd_port.replace_batchnorm(net, MyBN)
    assert isinstance(net[1], MyBN) and torch.all(net[1].running_mean == 0.5)
