"""The queue of a job's runs: which run a group of main_sweep.py's processes takes next.

The runs not taken yet are the index of the next one, in a file of CHECKPOINT_DIR read and
raised under the file's lock by a group's rank 0, so every run is taken once, by whichever
group is free first, on whichever host. A file, not an MPI window: MPI's one-sided operations
need the window's host to call into MPI to make progress, and it may be training.
"""
import os

from training.base import safeio

QUEUE = ".sweep-queue"  # in CHECKPOINT_DIR: the index of the next run to take, under its lock


class RunQueue:
    """The runs not taken yet, as the index of the next one in CHECKPOINT_DIR/.sweep-queue:
    a group's rank 0 reads and raises it under the file's lock, so every run is taken once,
    by whichever group is free first."""

    def __init__(self, folder):
        self.path = os.path.join(folder, QUEUE)

    def reset(self):
        """The whole sweep queued again (world rank 0, before any group takes a run)."""
        with safeio.locked(self.path + ".lock"):
            safeio.atomic_write(self.path, lambda f: f.write(b"0\n"))

    def take(self):
        """The index of the next run, now taken."""
        with safeio.locked(self.path + ".lock"):
            with open(self.path) as f:
                index = int(f.read())
            safeio.atomic_write(self.path, lambda f: f.write(f"{index + 1}\n".encode()))
        return index
