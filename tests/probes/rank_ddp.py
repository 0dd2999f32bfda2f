"""Run main_ddp.main() under torchrun and save what THIS rank ended with.

    torchrun --nproc_per_node 2 tests/probes/rank_ddp.py OUT_DIR [main_ddp.py flags]

Each rank writes OUT_DIR/rank<r>.pt with its model state and metric history,
where it ran (its host's name, the world and local sizes) and every path it wrote
(writes.py), as rank_horovod.py does for Horovod, so tests can compare ranks with each other. It runs main() as
main_ddp.py does, through launch.run_cli with the port's leaving of the job, and then,
however the run ended, writes OUT_DIR/threads<r>.txt: the names of the process group's
threads still alive as the interpreter is about to exit, one a line (none, when the rank
left the job whole).
"""
import os
import socket
import sys

# The repository (the trainers) and this folder (writes.py): a launcher may start this file
# through runpy from elsewhere, so its own folder is not on the path by itself.
sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                os.path.dirname(os.path.abspath(__file__))]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import writes  # noqa: E402

import main_ddp  # noqa: E402
from training.ports import process_group  # noqa: E402
from training.run import launch  # noqa: E402


def group_threads():
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # ended meanwhile
            pass
    return sorted(n for n in names if "gloo" in n)


def probe(out):
    def main(argv):
        model, result = main_ddp.main(argv)
        torch.save({"model": model.state_dict(), "result": result, "size": dist.get_world_size(),
                    "local_size": int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                    "threads": torch.get_num_threads(), "cores": sorted(os.sched_getaffinity(0)),
                    "host": socket.gethostname(), "written": writes.written},
                   os.path.join(out, f"rank{dist.get_rank()}.pt"))
    return main


if __name__ == "__main__":
    out, argv = sys.argv[1], sys.argv[2:]
    writes.watch()
    sys.argv[0] = main_ddp.__file__  # its one-line exits name main_ddp.py, as the port's do
    status = launch.run_cli(probe(out), argv, finish=process_group.leave_job)
    with open(os.path.join(out, f"threads{os.environ.get('RANK', 0)}.txt"), "w") as f:
        f.write("".join(name + "\n" for name in group_threads()))
    sys.exit(status)
