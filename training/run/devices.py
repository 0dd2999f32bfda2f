"""Where a process computes: its GPU, or its share of the CPU cores.

Two steps, in this order, which `place` makes in one call: `pick_device(local_rank,
local_size)` chooses the device, and `share_cores(device, local_rank, local_size, spare)`
divides the host's cores between its local processes on the CPU, so they do not
oversubscribe it, and gives the `spare` threads (Horovod's, from `other_threads()`) only the
time that training leaves. The ports pass in their local rank and size.

A sweep's processes first narrow themselves to their share of the host (sweeps/placement.py),
which `core_share`, `ordered_cores` and `pin_process` here serve as well.
"""
import os
import threading

import torch

from training.base.errors import UsageError


def take_device(local_rank=0, local_size=1, spare=()):
    """pick_device, then share_cores: this process's device, with its share of the cores
    taken on the CPU. (main_elastic.py calls the two apart: its share changes with its world.)"""
    device = pick_device(local_rank, local_size)
    share_cores(device, local_rank, local_size, spare)
    return device


def pick_device(local_rank=0, local_size=1):
    """This process's GPU (gpu_index), or the CPU where there is none. On a GPU, cuDNN times
    its algorithms for each convolution shape once and keeps the fastest (pytorch-cifar's
    cudnn.benchmark): the shapes here repeat every step."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    index = gpu_index(local_rank, local_size, torch.cuda.device_count())
    torch.cuda.set_device(index)
    torch.backends.cudnn.benchmark = True
    return torch.device("cuda", index)


def gpu_index(local_rank, local_size, visible):
    """Which of the `visible` GPUs local rank `local_rank` of `local_size` takes.

    With a GPU for every local process, its own. With one visible GPU, that one: a launcher
    or container that gives each process its own GPU shows it as device 0 (Slurm's
    --gpus-per-task=1 or --gpu-bind, CUDA_VISIBLE_DEVICES set per process). Fewer GPUs than
    processes, but more than one, is a one-line error: two processes would share a GPU."""
    if visible >= local_size:
        return local_rank
    if visible == 1:
        return 0
    shown = os.environ.get("CUDA_VISIBLE_DEVICES")
    raise UsageError(f"{local_size} processes on this host, but {visible} GPUs visible to each"
                     + (f" (CUDA_VISIBLE_DEVICES={shown})" if shown is not None else "")
                     + f"; start at most {visible} processes per host, or give each its own GPU "
                       "(e.g. srun --gpus-per-task=1)")


def starting_cores():
    """(cores, bound): the cores this process may use, hyperthread siblings together, and
    whether a launcher bound it to them. Taken once at the start: an elastic worker keeps
    it, to share the same cores anew after the world changes."""
    return ordered_cores(os.sched_getaffinity(0)), launcher_bound()


def other_threads():
    """The ids of this process's threads other than the calling one. Taken right after
    hvd.init(), before any training has started torch's thread pool, they are Horovod's
    own: its background thread and gloo's."""
    return {int(t) for t in os.listdir("/proc/self/task")} - {threading.get_native_id()}


def share_cores(device, local_rank=0, local_size=1, spare=(), start=None):
    """On the CPU, this process's share of the cores among the local_size processes on
    its host; nothing on a GPU. `start`: starting_cores() as taken at the start.

    The `spare` threads run at the lowest priority (SCHED_IDLE): only when the share's
    cores have nothing else to do, as when training waits for an allreduce. Horovod's
    background thread wakes every cycle (1 ms) to negotiate with the other ranks; on a core
    that training fills, each wake-up took time from training and the allreduces came one
    small tensor at a time. At np=2 on 2 cores (one per rank) it trains faster with the same
    results (benchmarks/results/RESULTS.md, horovod_idle_threads_gain).

    A process that its launcher did not bind to cores (horovodrun does not; mpirun does)
    is pinned, every thread of it, to its own share of the cores it may use, and runs
    that many torch threads. Unpinned, the ranks' compute threads and Horovod's
    background threads wander between cores, and train slower. With more local processes
    than cores none is pinned, and each runs one thread. OMP_NUM_THREADS set by the user
    turns all this off (threads_chosen: torchrun's own setting does not)."""
    if device.type != "cpu" or threads_chosen():  # the user's choice, which torch has already read
        return
    cores, bound = start or starting_cores()
    threads = len(cores)
    if not bound:  # else a launcher's binding is used as it is
        cores, threads = core_share(cores, local_rank, local_size)
        pin_process(cores)
    torch.set_num_threads(threads)
    for tid in spare:
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except ProcessLookupError:  # a thread that has ended
            pass


def threads_chosen():
    """Whether the user set OMP_NUM_THREADS. torchrun sets it to 1 for its workers when it
    is unset (it warns that you should tune it): that is no choice of the user's, so the
    cores are still split per local rank. torchrun sets it after it started, so it is
    missing from the environment torchrun itself was started with (/proc/PID/environ)."""
    if "OMP_NUM_THREADS" not in os.environ:
        return False
    if os.environ["OMP_NUM_THREADS"] != "1" or "TORCHELASTIC_RUN_ID" not in os.environ:
        return True
    try:
        with open(f"/proc/{os.getppid()}/environ", "rb") as f:
            launcher_env = f.read().split(b"\0")
    except OSError:  # the parent is gone or not ours to read: keep the setting
        return True
    return any(e.startswith(b"OMP_NUM_THREADS=") for e in launcher_env)


def core_share(cores, local_rank, local_size):
    """(cores, torch threads) for one of local_size processes sharing `cores`: an even
    split, any remainder spread over the ranks; all cores and one thread each when
    there are more processes than cores."""
    if local_size > len(cores):
        return list(cores), 1
    if not 0 <= local_rank < local_size:
        return list(cores), len(cores)
    n = len(cores)
    share = list(cores[local_rank * n // local_size:(local_rank + 1) * n // local_size])
    return share, len(share)


def launcher_bound():
    """Whether this process runs on fewer cores than its parent: a launcher (mpirun,
    taskset) bound it. A container's cpuset limits the parent as well, so it does not
    count as a binding."""
    try:
        return os.sched_getaffinity(0) < os.sched_getaffinity(os.getppid())
    except OSError:  # the parent is gone or not ours to read
        return len(os.sched_getaffinity(0)) < (os.cpu_count() or 1)


def ordered_cores(cpus):
    """CPU numbers with hyperthread siblings next to each other, so that a contiguous
    slice holds whole physical cores (Linux numbers siblings i and i + cores/2)."""
    def key(cpu):
        topo = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(topo + "physical_package_id") as a, open(topo + "core_id") as b:
                return int(a.read()), int(b.read()), cpu
        except (OSError, ValueError):
            return 0, cpu, cpu
    return sorted(cpus, key=key)


def pin_process(cores):
    """Every thread of this process, and those it starts later, on `cores`. Passes
    repeat until no new thread has appeared meanwhile."""
    done = set()
    while True:
        tids = set(map(int, os.listdir("/proc/self/task"))) - done
        if not tids:
            return
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cores)
            except ProcessLookupError:  # a thread that has just ended
                pass
        done |= tids

