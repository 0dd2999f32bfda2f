"""main_horovod.py with Horovod's threads at normal priority: the trainer as it was before they
got only the cores' spare time (devices.share_cores), kept to measure that choice against.

    horovodrun -np 2 python -m benchmarks.diagnostics.normal_priority [main_horovod.py flags]

It runs main_horovod.py's main() unchanged, except that no thread is handed to share_cores
as spare. Benchmarks only: the trainers never run it.
"""
import sys

import main_horovod
from training.run import devices, launch


def no_threads():
    return set()


if __name__ == "__main__":
    devices.other_threads = no_threads
    sys.exit(launch.run_cli(main_horovod.main))
