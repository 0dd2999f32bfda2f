"""A job whose every rank fails alike in a collective, so that no rank fails first and says why;
or meets a usage error, rank 0 last.

    torchrun --nproc_per_node 2 tests/probes/fail_alike.py ddp
    horovodrun -np 2 python tests/probes/fail_alike.py horovod
    mpirun -np 2 python tests/probes/fail_alike.py usage

ddp: each rank waits to receive from the next one and none sends, so gloo times every rank out
(a RuntimeError from gloo's transport). horovod: each rank allreduces a tensor of another shape
under one name, which Horovod's coordinator refuses on every rank (HorovodInternalError). Each
runs through launch.run_cli, as the trainers do, so each rank ends as a trainer's would.
usage: every rank raises the same UsageError, rank 0 three seconds after the others (as when
it is still importing torch), which rank 0 alone says.
"""
import datetime
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from training.run import launch  # noqa: E402


def ddp(argv):
    import torch.distributed as dist
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
    rank, size = dist.get_rank(), dist.get_world_size()
    try:
        dist.recv(torch.zeros(1), src=(rank + 1) % size)
    finally:
        dist.destroy_process_group()


def horovod(argv):
    import horovod.torch as hvd
    hvd.init()
    hvd.allreduce(torch.zeros(2 + hvd.rank()), name="shape_by_rank")


def usage(argv):
    from training.base.errors import UsageError
    if launch.launcher_rank() == 0:
        time.sleep(3)
    raise UsageError("--epochs must be positive (got 0)")


if __name__ == "__main__":
    sys.exit(launch.run_cli({"ddp": ddp, "horovod": horovod, "usage": usage}[sys.argv[1]], argv=sys.argv[2:]))
