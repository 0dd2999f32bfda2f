"""main_horovod.py with Horovod's threads ahead of training on the CPU: the highest nice
priority (-20), so that the allreduce takes a core the moment it has work, as it does on a GPU
host, where compute leaves the cores free. Needs root.

    horovodrun -np 2 python -m benchmarks.diagnostics.comm_first [main_horovod.py flags]

It runs main_horovod.py's main() unchanged, except that the threads Horovod started at init
(devices.other_threads) get priority -20 instead of being handed to share_cores as spare.
Benchmarks only: the trainers never run it.
"""
import os
import sys

import main_horovod
from training.run import devices, launch

_other_threads = devices.other_threads


def first():
    for tid in _other_threads():
        os.setpriority(os.PRIO_PROCESS, tid, -20)
    return set()


if __name__ == "__main__":
    devices.other_threads = first
    sys.exit(launch.run_cli(main_horovod.main))
