"""training/adasum.py: Adasum's limits (its runs are in test_main_horovod.py and test_channels_last.py)."""
import pytest

from training import adasum
from training.errors import UsageError


def test_adasum_needs_mpi_and_a_power_of_two():
    adasum.check(4, mpi_enabled=True)
    with pytest.raises(UsageError, match="MPI controller"):
        adasum.check(4, mpi_enabled=False)
    with pytest.raises(UsageError, match="power-of-two number of processes, not 3"):
        adasum.check(3, mpi_enabled=True)
