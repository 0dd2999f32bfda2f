"""Where share_cores puts this process, after each of several calls.

    python tests/probes/placement.py '[[local_rank, local_size], ...]'

Calls devices.share_cores(cpu, local_rank, local_size, start=start) for each pair in turn,
always with the cores the process started with (as an elastic worker does after each
reset), and prints as JSON, after each call: the process's cores, the cores of a
thread that existed before the calls, and torch's thread count.
"""
import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from training.run import devices  # noqa: E402

early = threading.Event()
thread = threading.Thread(target=early.wait, daemon=True)  # a thread that exists before the calls
thread.start()
start = devices.starting_cores()
states = []
for local_rank, local_size in json.loads(sys.argv[1]):
    devices.share_cores(torch.device("cpu"), local_rank, local_size, start=start)
    states.append({"process": sorted(os.sched_getaffinity(0)),
                   "early": sorted(os.sched_getaffinity(thread.native_id)),
                   "threads": torch.get_num_threads()})
print(json.dumps(states))
