"""Where a sweep's process computes before any run: main_sweep.py's runs each see only their own
group, whose local ranks start at 0 on every host, so each process first narrows itself to its
share of the host by its rank among all of the job's processes there:
`take_host_share(*node_slot())`. node_slot is an MPI collective of the whole job."""
import os

import torch

from training.run import devices


def node_slot():
    """This process's rank among the job's processes on its host, and their number (an MPI
    collective: every process of the job calls it)."""
    from mpi4py import MPI
    node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_rank(), node.Get_size()
    finally:
        node.Free()


def take_host_share(slot, slots):
    """Show this process only its share of the host, as a launcher's binding does, by its
    `slot` of the `slots` processes of the job there (node_slot): on a host with several GPUs
    one of them (shared_gpu), by CUDA_VISIBLE_DEVICES before CUDA starts; and its share of the
    cores (devices.core_share), every thread of it pinned there. A run's port then places itself
    within that share by hvd.local_rank(), which counts within the run's group: two runs on one
    host would otherwise both take GPU 0 and the same cores. devices.take_device() then finds the
    process bound (devices.launcher_bound) and keeps the share as it is."""
    gpus = torch.cuda.device_count()  # NVML's count: CUDA is not started by it
    if gpus > 1:
        os.environ["CUDA_VISIBLE_DEVICES"] = shared_gpu(slot, gpus)
    cores, _ = devices.core_share(devices.ordered_cores(os.sched_getaffinity(0)), slot, slots)
    devices.pin_process(cores)


def shared_gpu(slot, gpus):
    """The id (as CUDA_VISIBLE_DEVICES names it) of the GPU for `slot` of a host's processes:
    its own where the host has one for each of them, else one it shares with as few as may be
    (slot modulo the GPUs), so that consecutive ranks, one run's group, get different ones."""
    shown = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = shown.split(",") if shown else [str(i) for i in range(gpus)]
    return ids[slot % gpus]
