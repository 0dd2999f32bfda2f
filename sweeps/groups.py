"""The job's processes as groups: how main_sweep.py makes one MPI job many independent
Horovod runs.

mpi4py splits MPI.COMM_WORLD into groups of --ranks-per-run consecutive ranks (`split`,
`ranks_per_run`). A group trains one run at a time as an ordinary Horovod run on the group's
communicator (`run_in_group`): its collectives stay within its ranks, and a run that fails
ends alone. A process whose group has no run left waits for the others without keeping a core
busy (`wait_for_every_run`). Horovod's gloo controller has no communicator to split
(`check_controller`). `run_job` is the job's course, a grid's and a study's alike: each is a
`Job` (sweep.GridJob, search.StudyJob); which run a group takes next is run_queue.py's (a sweep)
or search.py's (a study); which share of its host a process computes on, placement.py's.
"""
import os
import sys
import time
import traceback

from sweeps.headed import headed
from sweeps.placement import node_slot, take_host_share
from training.base.errors import RunsFailed, TrainerError, UsageError
from training.run import launch

# Why a run failed on a rank whose collective failed because another rank of the run failed.
RUN_PEER_FAILED = "another rank of this run failed (its error is above)"


class Job:
    """What a main_sweep.py job does on its groups: a grid (sweep.GridJob) and a study
    (search.StudyJob) each say it, and run_job runs it."""
    per_run = 1  # the processes of each group

    def prepare(self):
        """World rank 0, before any work (the queue reset, the study opened): what every rank
        gets; a TrainerError raised here ends the job on every rank."""

    def source(self, index, prepared):
        """On each group's rank 0 (group `index`): where the group takes its runs from, whose
        take(ranks) gives the group's next run, None once none is left."""
        raise NotImplementedError

    def train(self, group, source, run, ranks):
        """Every rank of the group trains `run` (`source` on the group's rank 0, else None);
        returns its outcome."""
        raise NotImplementedError

    def summarize(self, outcomes):
        """World rank 0, once every run has ended, with every group's outcomes: why the job
        failed, or None."""


def run_job(job):
    """A Job's course, on every process, once the job's checks have passed: world rank 0
    prepares; each process narrows itself to its share of its host and joins its group of
    job.per_run; each group's rank 0 takes runs from its source and every rank of the group
    trains each; world rank 0 sums up every outcome, and RunsFailed ends the job on every rank
    where that says it failed. An error on one process outside a run ends the whole job at once
    (abort_job)."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    prepared = on_rank0(job.prepare)
    try:
        take_host_share(*node_slot())
        group, index, ranks = split(world, job.per_run)
        source = job.source(index, prepared) if group.Get_rank() == 0 else None
        outcomes = []
        while (run := group.bcast(source.take(ranks) if source else None)) is not None:
            outcomes.append(job.train(group, source, run, ranks))
        wait_for_every_run(world)
        gathered = world.gather(outcomes if group.Get_rank() == 0 else [], root=0)
        failure = (job.summarize([o for part in gathered for o in part])
                   if world.Get_rank() == 0 else None)
        failure = world.bcast(failure, root=0)
    except Exception as e:
        if world.Get_size() == 1:
            raise
        abort_job(world, e)
    group.Free()
    if failure:
        raise RunsFailed(failure)


def abort_job(world, e):
    """An error on this process alone outside a run (a storage call out of retries, a bug):
    the other processes wait for it in a collective, and at exit MPI_Finalize would wait for
    them, so the job would hang. It is said here (one line for a TrainerError, else its
    traceback) and MPI ends every process of the job (MPI_Abort) with its exit status."""
    if isinstance(e, TrainerError):
        launch.say(f"{os.path.basename(sys.argv[0])}: error (rank {world.Get_rank()}): {e}")
    else:
        traceback.print_exc()
    sys.stderr.flush()
    world.Abort(e.exit_code if isinstance(e, TrainerError) else 1)


def on_rank0(fn):
    """fn() on world rank 0, and what it returned on every rank; a TrainerError it raised ends
    the job on every rank, rank 0 alone saying it."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    out = None
    if world.Get_rank() == 0:
        try:
            out = fn()
        except TrainerError as e:
            out = e
    out = world.bcast(out, root=0)
    if isinstance(out, TrainerError):
        out.every_rank = True  # now every rank's: rank 0 alone says it
        raise out
    return out


def nested(args):
    """main_sweep.py's MLflow run, where --mlflow asks for one (tracking.parent_run), every run
    or trial of this process nested under it: its Tracker on world rank 0, else None. Its lines
    are headed "search" or "sweep", as a run's or a trial's are by its name."""
    from mpi4py import MPI

    from training.run import tracking
    parent = {}

    def start():
        with headed("search" if args.search else "sweep"):  # its sender's lines too
            parent["tracker"], run_id = tracking.parent_run(args, MPI.COMM_WORLD.Get_size())
        return run_id
    tracking.nest_runs_under(on_rank0(start))
    return parent.get("tracker")


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
    if why is not None:  # its MLflow run, where it has one, ends now, not with the job
        from training.run import tracking
        tracking.end_unfinished("FAILED")
    hvd.shutdown()  # this run's Horovod; the group's next run starts its own
    return history, why


def wait_for_every_run(world):
    """Return once every process has ended its runs. MPI's blocking collectives poll, so a
    process whose group ran out of runs first would keep a core busy while the others train;
    this one looks every 0.2 s and sleeps in between."""
    done = world.Ibarrier()
    while not done.Test():
        time.sleep(0.2)


def shared(comm, value):
    """comm.bcast(value) from rank 0, which may be waiting (for a folder, a database): the
    other processes look every 0.2 s meanwhile, as in wait_for_every_run, and spin no core."""
    if comm.Get_size() == 1:
        return value
    wait_for_every_run(comm)
    return comm.bcast(value, root=0)
