"""What the Horovod ports ask of Horovod beyond its own defaults: the settings it starts with on
CUDA, the compression its gradient allreduce goes through, and Adasum's limits and LR scale.
Horovod is imported only where it is used.

**Settings.** Horovod reads its settings from the environment once, in hvd.init(). On CUDA the
ports give it HOROVOD_ENABLE_ASYNC_COMPLETION=1 (`apply`, before init). Without it, Horovod marks
a gradient's allreduce done only after a thread of its own has waited for the GPU to finish it
(cudaEventSynchronize), so optimizer.synchronize() in every step holds the host until the GPU has
run the whole backward and the allreduce: the host can no longer queue the next step's work while
the GPU computes, and whatever it does between steps (Horovod's per-tensor bookkeeping, the
update, the next forward's launches) leaves the GPU idle. With it, the completion is a CUDA event
that the training stream waits on, and the host goes on at once. It is Horovod's own setting
(off by default there; its XLA path turns it on); it changes when the host waits, not what is
summed. Nothing is set on the CPU, where Horovod's collectives complete on the host anyway. A
variable already in the environment is left as it is: HOROVOD_ENABLE_ASYNC_COMPLETION=0 turns
the default off.

**Compression.** The gradients go through `layout.GradLayout`, which hands Horovod the contiguous
view of a channels_last gradient, around Horovod's own fp16 compression (--fp16-allreduce) or
none.

**Adasum** (--use-adasum) combines the ranks' gradients by an adaptive sum instead of averaging
them, so the LR is not multiplied by the number of processes, as linear scaling does for an
average. Where Horovod runs Adasum on GPUs with NCCL, it first sums the gradients within each
host, and the LR then scales by the processes on a host. Horovod runs Adasum on its MPI
controller only, and at power-of-two world sizes.
"""
import os

import torch

from training import layout
from training.errors import UsageError

CUDA_DEFAULTS = {"HOROVOD_ENABLE_ASYNC_COMPLETION": "1"}


def defaults(cuda):
    """The settings the ports give Horovod on this kind of device."""
    return dict(CUDA_DEFAULTS) if cuda else {}


def apply(cuda=None):
    """Put the defaults for this machine (CUDA where torch sees a GPU) into the environment
    where it has none of its own, before hvd.init() reads it. Returns what was set."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    given = {k: v for k, v in defaults(cuda).items() if k not in os.environ}
    os.environ.update(given)
    return given



def compression(fp16):
    """The compression DistributedOptimizer is given: GradLayout around fp16's or none."""
    import horovod.torch as hvd
    return layout.GradLayout(hvd.Compression.fp16 if fp16 else hvd.Compression.none)


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
    check(hvd.size(), hvd.mpi_enabled())
    return hvd.local_size() if torch.cuda.is_available() and hvd.nccl_built() else 1
