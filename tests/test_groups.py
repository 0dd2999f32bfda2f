"""groups.py: the size of the groups. The split, a run in a group and the wait for every run
run in real MPI jobs in tests/test_sweep.py and tests/test_search.py."""
import types

import pytest

from sweeps import groups
from training.base.errors import UsageError


def test_ranks_per_run_defaults_to_every_run_at_once_where_that_divides():
    given = types.SimpleNamespace(ranks_per_run=None)
    assert groups.ranks_per_run(given, runs=4, processes=8) == 2
    assert groups.ranks_per_run(given, runs=3, processes=8) == 1  # 8 does not divide: queued on 1s
    assert groups.ranks_per_run(given, runs=16, processes=8) == 1
    assert groups.ranks_per_run(types.SimpleNamespace(ranks_per_run=4), runs=3, processes=8) == 4
    with pytest.raises(UsageError, match="--ranks-per-run 3 does not divide the 8 processes"):
        groups.ranks_per_run(types.SimpleNamespace(ranks_per_run=3), runs=3, processes=8)
