"""Run main_horovod.main() under a real launcher and save what THIS rank ended with.

    horovodrun -np 2 python tests/probes/rank_horovod.py OUT_DIR [main_horovod.py flags]

Each rank writes OUT_DIR/rank<r>.pt with its model state and metric history,
where it ran (its host's name, Horovod's sizes), its threads' scheduling
policies and every path it wrote (writes.py), so tests can compare ranks with each other, which the trainer (rank 0
saves) cannot show.
"""
import os
import socket
import sys
import threading

# The repository (the trainers) and this folder (writes.py): a launcher may start this file
# through runpy from elsewhere, so its own folder is not on the path by itself.
sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                os.path.dirname(os.path.abspath(__file__))]

import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402
import writes  # noqa: E402

import main_horovod  # noqa: E402

if __name__ == "__main__":
    out, argv = sys.argv[1], sys.argv[2:]
    writes.watch()
    model, result = main_horovod.main(argv)
    policies = {}  # thread id -> scheduling policy (os.SCHED_OTHER, os.SCHED_IDLE, ...)
    for tid in map(int, os.listdir("/proc/self/task")):
        try:
            policies[tid] = os.sched_getscheduler(tid)
        except OSError:  # a thread that has just ended
            pass
    torch.save({"model": model.state_dict(), "result": result, "size": hvd.size(),
                "local_size": hvd.local_size(), "cross_size": hvd.cross_size(),
                "host": socket.gethostname(), "main_thread": threading.get_native_id(),
                "policies": policies, "torch_threads": torch.get_num_threads(),
                "written": writes.written},
               os.path.join(out, f"rank{hvd.rank()}.pt"))
