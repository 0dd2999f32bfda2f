"""A process that holds a lock file with safeio.hold until it is killed.

    python tests/probes/holder.py FILE

Prints "held" once it holds FILE (or what the holder wrote, if another process holds it).
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from training.base import safeio  # noqa: E402

got = safeio.hold(sys.argv[1], f"the holder probe, process {os.getpid()}")
print("held" if got is None else f"refused: {got}", flush=True)
while got is None:
    time.sleep(1)
