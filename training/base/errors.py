"""The kinds of failure a user sees as one line instead of a traceback."""


class TrainerError(Exception):
    """Something outside the code is wrong (data, checkpoint, disk). Exit status 1. It may be
    one rank's alone, so each rank that meets it says so."""
    exit_code = 1
    every_rank = False  # True: every rank meets it alike, so rank 0 alone says it


class UsageError(TrainerError):
    """A flag is wrong or flags do not fit together. Exit status 2, as argparse uses."""
    exit_code = 2
    every_rank = True


class Diverged(TrainerError):
    """The training loss became non-finite. Every rank sees the same reduced loss and stops
    in the same step, before anything of the epoch is saved. Exit status 3, which the sbatch
    files do not requeue: a rerun from the same checkpoint would diverge again."""
    exit_code = 3
    every_rank = True


class RunsFailed(TrainerError):
    """Some runs of a --sweep failed (each said why); the others finished. Exit status 1."""
    every_rank = True
