"""errors.py: each kind of failure's exit status and who says it (launch.py prints them)."""
from training.base.errors import Diverged, RunsFailed, TrainerError, UsageError


def test_exit_statuses_and_who_says_them():
    assert (TrainerError.exit_code, UsageError.exit_code, Diverged.exit_code, RunsFailed.exit_code) == (1, 2, 3, 1)
    # one rank's own trouble is said by that rank; what every rank meets alike, by rank 0 alone
    assert not TrainerError.every_rank and UsageError.every_rank and Diverged.every_rank
    assert issubclass(UsageError, TrainerError) and issubclass(Diverged, TrainerError)
