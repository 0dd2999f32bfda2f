"""The job's processes as groups: how main_sweep.py makes one MPI job many independent
Horovod runs.

mpi4py splits MPI.COMM_WORLD into groups of --ranks-per-run consecutive ranks (`split`,
`ranks_per_run`). A group trains one run at a time as an ordinary Horovod run on the group's
communicator (`run_in_group`): its collectives stay within its ranks, and a run that fails
ends alone. A process whose group has no run left waits for the others without keeping a core
busy (`wait_for_every_run`). Horovod's gloo controller has no communicator to split
(`check_controller`). Which run a group takes next is run_queue.py's (a sweep) or search.py's
(a study); which share of its host a process computes on, devices.py's.
"""
import os
import sys
import time

from sweeps.headed import headed
from training.base.errors import TrainerError, UsageError
from training.run import launch

# Why a run failed on a rank whose collective failed because another rank of the run failed.
RUN_PEER_FAILED = "another rank of this run failed (its error is above)"


def check_controller(flag="--sweep"):
    """The split needs Horovod on MPI; the gloo controller has no communicator to split."""
    import horovod.torch as hvd
    if os.environ.get("HOROVOD_CONTROLLER") == "gloo" or not hvd.mpi_built():
        raise UsageError(f"{flag} splits an MPI job with mpi4py and this job runs on Horovod's "
                         "gloo controller; launch with mpirun, srun --mpi=pmix or horovodrun --mpi")


def ranks_per_run(args, runs, processes):
    """--ranks-per-run, checked, or its default: the processes over the runs where that
    divides (every run at once), else 1 (the runs queue on single-process groups)."""
    k = args.ranks_per_run
    if k is None:
        return processes // runs if processes % runs == 0 else 1
    if processes % k:
        raise UsageError(f"--ranks-per-run {k} does not divide the {processes} processes; "
                         f"pick a divisor of {processes}, or launch a multiple of {k}")
    return k


def split(world, per_run):
    """This process's group of `per_run` consecutive ranks of `world`: (its communicator, the
    group's index, its world ranks as a summary names them: "2", or "2-3")."""
    first = world.Get_rank() // per_run * per_run  # the group's first rank in the world
    ranks = str(first) if per_run == 1 else f"{first}-{first + per_run - 1}"
    return world.Split(first, world.Get_rank()), first // per_run, ranks


def run_in_group(main, argv, group, head, what):
    """Train one run, main(argv), as an ordinary main_horovod.py run of the ranks in `group`,
    every line it prints headed by `head`: Horovod started on the group's communicator (main's
    own hvd.init() then finds it started) and shut down after. Returns (its metric history,
    None), or (None, why) where it failed, on all of its ranks alike or on one; the rank that
    met the error says it in one line naming the run (`what`, e.g. "run lr0.1"). A crash of a
    process, and a stop signal, go on up: they end the job, as they end any run."""
    import horovod.torch as hvd
    history, why = None, None
    hvd.init(comm=group)
    try:
        with headed(head):
            _, history = main(argv)
    except TrainerError as e:
        why = str(e)
        if group.Get_rank() == 0 or not e.every_rank:  # one rank's own error: that rank says it
            launch.say(f"{os.path.basename(sys.argv[0])}: error: {what}: {e}")
    except Exception as e:  # a collective of this run failed because another of its ranks did
        if not launch.peer_failed(e):
            raise
        why = RUN_PEER_FAILED
    hvd.shutdown()  # this run's Horovod; the group's next run starts its own
    return history, why


def wait_for_every_run(world):
    """Return once every process has ended its runs. MPI's blocking collectives poll, so a
    process whose group ran out of runs first would keep a core busy while the others train;
    this one looks every 0.2 s and sleeps in between."""
    done = world.Ibarrier()
    while not done.Test():
        time.sleep(0.2)
