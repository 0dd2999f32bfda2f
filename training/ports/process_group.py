"""The DDP port's process group: how a process joins torch.distributed's job, how it leaves
it whole, however its run ended, and what DDP is told of the BatchNorm buffers.

Leaving whole matters because of how gloo's worker threads end. A worker that finishes a
collective drops its tensors a moment after the caller has seen the result; where such a
tensor has a Python object, dropping it takes the GIL. If the interpreter has started to
finalize by then, Python ends that thread (pthread_exit) in the middle of a C++ destructor,
and the process dies with "terminate called without an active exception" (SIGABRT). Only
the group's destructor joins those threads, so it must run before the interpreter exits:
`leave_job` destroys the group on every path out of main(), and `join_job` makes sure that
nothing else keeps the group alive after that.
"""
import inspect
import os

import torch
import torch.distributed as dist


def join_job(device):
    """Join the job torchrun started (its environment names the rank, the world size and the
    rendezvous), or make a group of one for a lone `python main_ddp.py`: gloo on the CPU,
    NCCL on CUDA.

    torch.distributed.nn is imported first. Its functions take `group=group.WORLD` as a
    default argument, which binds the default group itself when the module is imported after
    the group exists, as DistributedDataParallel's first use of torch._dynamo does. Those
    ten references would keep the group, and its worker threads, alive after
    destroy_process_group; imported now, the defaults hold None."""
    import torch.distributed.nn  # noqa: F401 (imported for the order, before the group)

    alone = {} if "RANK" in os.environ else dict(store=dist.HashStore(), rank=0, world_size=1)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", **alone)


def leave_job():
    """Destroy the process group, which joins its worker threads, so that none is left to
    touch Python while the interpreter finalizes. launch.run_cli calls it after main()
    however main ended: returned, stopped by a signal, or failed. On the CPU the ports issue
    no collective that is still running when Python code runs again (DDP waits for its
    buckets at the end of backward, the metric sums are synchronous), so a stopping rank has
    nothing to wait for here. With NCCL this path is untested here."""
    if dist.is_initialized():
        dist.destroy_process_group()



def distributed_model(model):
    """The DDP port's model: DistributedDataParallel, BatchNorm's running statistics each rank's
    own through an epoch, as under Horovod, until the loop averages them (buffers_unsynced).
    Every parameter that requires a gradient gets one in every step, so DDP need not search for
    unused ones (find_unused_parameters costs a graph walk)."""
    return torch.nn.parallel.DistributedDataParallel(
        model, gradient_as_bucket_view=True, **buffers_unsynced())


def buffers_unsynced():
    """DistributedDataParallel's keyword that leaves BatchNorm's running statistics to each rank
    between the loop's averages (utils.average_batchnorm), as under Horovod, instead of
    broadcasting rank 0's before every forward. PyTorch 2.14 calls it forward_sync_buffers and
    deprecates broadcast_buffers; releases before it (2.11, for one) know only
    broadcast_buffers, which also skips the broadcast at the start. That one is not needed:
    every rank builds the same model from one seed or reads the same checkpoint."""
    ddp = inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
    if "forward_sync_buffers" in ddp:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def summed_copy(all_reduce):
    """A metric allreduce from an in-place sum (torch.distributed.all_reduce): the sum of a
    copy, so that the running sums it is given stay this rank's own."""
    def allreduce(t):
        t = t.clone()
        all_reduce(t)
        return t
    return allreduce
