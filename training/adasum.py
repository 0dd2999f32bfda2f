"""Horovod's Adasum (--use-adasum): its limits, and the LR scale it takes.

Adasum combines the ranks' gradients by an adaptive sum instead of averaging them, so the LR is
not multiplied by the number of processes, as linear scaling does for an average. Where Horovod
runs Adasum on GPUs with NCCL, it first sums the gradients within each host, and the LR then
scales by the processes on a host. Horovod runs Adasum on its MPI controller only, and at
power-of-two world sizes. Horovod is imported where it is used.
"""
from training.errors import UsageError


def check(size, mpi_enabled):
    """Adasum's limits, for a world of `size` processes: one line each."""
    if not mpi_enabled:
        raise UsageError("--use-adasum needs Horovod's MPI controller: launch with horovodrun "
                         "--mpi or mpirun")
    if size & (size - 1):
        raise UsageError(f"--use-adasum needs a power-of-two number of processes, not {size}")


def lr_size(args):
    """What the LR is multiplied by under --use-adasum (before --batches-per-allreduce): the
    local size where Horovod's NCCL sums within a host first (on GPUs), else 1, once Adasum's
    limits are checked. None without --use-adasum: the world size, as for an average.
    Horovod must have been initialized."""
    if not args.use_adasum:
        return None
    import horovod.torch as hvd
    import torch
    check(hvd.size(), hvd.mpi_enabled())
    return hvd.local_size() if torch.cuda.is_available() and hvd.nccl_built() else 1
