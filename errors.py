"""The two kinds of failure a user sees as one line instead of a traceback."""


class TrainerError(Exception):
    """Something outside the code is wrong (data, checkpoint, disk). Exit status 1."""
    exit_code = 1


class UsageError(TrainerError):
    """A flag is wrong or flags do not fit together. Exit status 2, as argparse uses."""
    exit_code = 2
