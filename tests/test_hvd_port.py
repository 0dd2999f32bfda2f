"""training/hvd_port.py: the settings Horovod starts with, and Adasum's limits (its runs are in
test_main_horovod.py and test_channels_last.py)."""
import os

import pytest

from training import hvd_port
from training.errors import UsageError


def test_adasum_needs_mpi_and_a_power_of_two():
    hvd_port.check(4, mpi_enabled=True)
    with pytest.raises(UsageError, match="MPI controller"):
        hvd_port.check(4, mpi_enabled=False)
    with pytest.raises(UsageError, match="power-of-two number of processes, not 3"):
        hvd_port.check(3, mpi_enabled=True)


def test_async_completion_is_given_on_cuda_only_and_never_over_the_users_setting(monkeypatch):
    monkeypatch.delenv("HOROVOD_ENABLE_ASYNC_COMPLETION", raising=False)
    assert hvd_port.apply(cuda=False) == {}
    assert "HOROVOD_ENABLE_ASYNC_COMPLETION" not in os.environ
    assert hvd_port.apply(cuda=True) == {"HOROVOD_ENABLE_ASYNC_COMPLETION": "1"}
    assert os.environ["HOROVOD_ENABLE_ASYNC_COMPLETION"] == "1"
    monkeypatch.setenv("HOROVOD_ENABLE_ASYNC_COMPLETION", "0")
    assert hvd_port.apply(cuda=True) == {} and os.environ["HOROVOD_ENABLE_ASYNC_COMPLETION"] == "0"
