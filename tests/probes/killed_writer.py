"""A process killed (SIGKILL) half-way through an atomic write of FILE.

    python tests/probes/killed_writer.py FILE
"""
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from training.base import safeio  # noqa: E402


def write(f):
    f.write(b"half a checkpoint" * 1000)
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)


safeio.atomic_write(sys.argv[1], write)
