"""main_sweep.py's work: one MPI job as many independent Horovod runs, queued on groups.

    mpirun -np 8 python main_sweep.py --arch resnet18 --sweep lr=0.05,0.1,0.2,0.4 --sweep seed=0,1
    mpirun -np 2 python main_sweep.py --sweep seed=0,1,2,3,4 --sweep lr=0.05,0.1 --ranks-per-run 1

The product of the --sweep lists makes the runs. mpi4py splits MPI.COMM_WORLD into groups of
--ranks-per-run consecutive ranks (by default the world size over the runs, where that divides,
else 1), and each group trains runs one after another, each the next that no group has taken
yet (RunQueue), until none is left: a long run holds back only its own group. Each run is an
ordinary main_horovod.py run of its group: Horovod started on the group's communicator, its
files in CHECKPOINT_DIR/<run>/ (ckpt.pth, best.pth, metrics.csv, tb/, curves.png), every line it
prints headed by its settings. The sweep adds --auto-resume (unless --resume or --overwrite is
given), so every run resumes alone, and a re-submitted sweep continues the runs that are not
finished and trains nothing more of those that are. CHECKPOINT_DIR must be a folder every host
sees: a run may be continued by another group than the one that started it. World rank 0
gathers every run's outcome and writes the summary (sweep_report.py).

A run that fails, on all of its ranks alike (a divergence, a value that does not suit it) or
on one of them (its checkpoint, read by its rank 0 alone, is corrupt; the others' collectives
then fail), ends alone; its group takes the next run, and the job exits 1 at the end. A crash
of one rank, and a stop signal, end the whole job, as they end any run; each run keeps its
last finished epoch.
"""
import contextlib
import itertools
import os
import sys
import time

from training import cli, devices, launch, safeio, sweep_report
from training.errors import RunsFailed, TrainerError, UsageError

QUEUE = ".sweep-queue"  # in CHECKPOINT_DIR: the index of the next run to take, under its lock


def combinations(axes):
    """The runs of --sweep's lists: [(name, [(flag, value), ...])], the last list varying fastest.
    The name (e.g. lr0.1_seed1) is the run's folder under --checkpoint-dir."""
    flags = [flag for flag, _ in axes]
    runs = []
    for values in itertools.product(*(values for _, values in axes)):
        combo = list(zip(flags, values))
        runs.append(("_".join(f"{flag}{value}" for flag, value in combo), combo))
    return runs


def label(combo):
    """How a run's lines begin: its settings, e.g. `lr=0.1 seed=1`."""
    return " ".join(f"{flag}={value}" for flag, value in combo)


def run_argv(args, argv, name, combo):
    """The flags of one run: the job's without main_sweep.py's own, then the run's values and
    folder (the last wins)."""
    argv, kept = list(sys.argv[1:] if argv is None else argv), []
    while argv:
        a = argv.pop(0)
        if a in ("--sweep", "--ranks-per-run"):
            argv.pop(0)
        elif not a.startswith(("--sweep=", "--ranks-per-run=")):
            kept.append(a)
    extra = [f"--{flag}={value}" for flag, value in combo]
    extra += ["--checkpoint-dir", os.path.join(args.checkpoint_dir, name)]
    if not (args.resume or args.auto_resume or args.overwrite):
        extra.append("--auto-resume")
    return [*kept, *extra]


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


def node_slot():
    """This process's rank among the job's processes on its host, and their number."""
    from mpi4py import MPI
    node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_rank(), node.Get_size()
    finally:
        node.Free()


def take_host_share(slot, slots):
    """Show this process only its share of the host, as a launcher's binding does: a GPU of
    its own where the host has one for each of the job's processes on it, else one it shares
    with as few as may be (slot modulo the GPUs, so that consecutive ranks, one run's group,
    get different ones), by CUDA_VISIBLE_DEVICES before CUDA starts; and its share of the
    cores (its affinity). A run's port then places itself within that share by
    hvd.local_rank(), which counts within the run's group: two runs on one host would
    otherwise both take GPU 0 and the same cores."""
    import torch
    gpus = torch.cuda.device_count()  # NVML's count: CUDA is not started by it
    if gpus > 1:
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = shown.split(",") if shown else [str(i) for i in range(gpus)]
        os.environ["CUDA_VISIBLE_DEVICES"] = ids[slot % gpus]
    cores, _ = devices.core_share(devices.ordered_cores(os.sched_getaffinity(0)), slot, slots)
    os.sched_setaffinity(0, cores)


def check_controller():
    """The split needs Horovod on MPI; the gloo controller has no communicator to split."""
    import horovod.torch as hvd
    if os.environ.get("HOROVOD_CONTROLLER") == "gloo" or not hvd.mpi_built():
        raise UsageError("--sweep splits an MPI job with mpi4py and this job runs on Horovod's "
                         "gloo controller; launch with mpirun, srun --mpi=pmix or horovodrun --mpi")


class RunQueue:
    """The runs not taken yet, as the index of the next one in CHECKPOINT_DIR/.sweep-queue:
    a group's rank 0 reads and raises it under the file's lock, so every run is taken once,
    by whichever group is free first. A file, not an MPI window: MPI's one-sided operations
    need the window's host to call into MPI to make progress, and it may be training."""

    def __init__(self, folder):
        self.path = os.path.join(folder, QUEUE)

    def reset(self):
        """The whole sweep queued again (world rank 0, before any group takes a run)."""
        with safeio.locked(self.path + ".lock"):
            safeio.atomic_write(self.path, lambda f: f.write(b"0\n"))

    def take(self):
        """The index of the next run, now taken."""
        with safeio.locked(self.path + ".lock"):
            with open(self.path) as f:
                index = int(f.read())
            safeio.atomic_write(self.path, lambda f: f.write(f"{index + 1}\n".encode()))
        return index


def run(main, args, argv):
    """main_sweep.py: every check first (check_sweep), then this process's group trains runs
    from the queue until none is left (train_in_group each), then the outcomes are gathered on
    world rank 0, which writes the summary (gather_outcomes), and the job's status
    (RunsFailed when a run failed)."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    runs, per_run = check_sweep(args, argv, world.Get_size())
    take_host_share(*node_slot())
    first = world.Get_rank() // per_run * per_run  # the group's first rank in the world
    ranks = str(first) if per_run == 1 else f"{first}-{first + per_run - 1}"
    group = world.Split(first, world.Get_rank())
    queue = RunQueue(args.checkpoint_dir)
    if world.Get_rank() == 0:
        queue.reset()
    world.Barrier()
    outcomes = []
    while (index := group.bcast(queue.take() if group.Get_rank() == 0 else None)) < len(runs):
        name, combo = runs[index]
        outcome = train_in_group(main, run_argv(args, argv, name, combo), name, combo, group)
        outcomes.append(dict(outcome, ranks=ranks))
    failed = gather_outcomes(world, group, outcomes, args, runs)
    group.Free()
    if failed:
        summary = os.path.join(args.checkpoint_dir, "sweep.csv")
        raise RunsFailed(f"{failed} of {len(runs)} runs failed (their errors are above, and their "
                         f"rows in {summary}); the others finished")


def check_sweep(args, argv, processes):
    """(the runs, the processes per run), once every check that can fail for the whole sweep
    has passed on every rank alike, before any work: the controller, each run's flags, the
    ranks per run."""
    check_controller()
    runs = combinations(args.sweep)
    parser = cli.add_horovod_args(cli.build_parser(""))
    for name, combo in runs:  # every run's flags are sound, or nothing starts
        cli.parse_args(parser, run_argv(args, argv, name, combo))
    return runs, ranks_per_run(args, len(runs), processes)


def train_in_group(main, argv, name, combo, group):
    """Train one run as an ordinary main_horovod.py run of the ranks in `group`, every line it
    prints headed by its settings: Horovod started on the group's communicator (main's own
    hvd.init() then finds it started) and shut down after. Returns the run's outcome."""
    import horovod.torch as hvd
    outcome = {"run": name, **dict(combo)}
    hvd.init(comm=group)
    try:
        with headed(label(combo)):
            _, history = main(argv)
        outcome.update(sweep_report.summary(history), status="finished")
    except TrainerError as e:
        outcome.update(status=f"failed: {e}")
        if group.Get_rank() == 0 or not e.every_rank:  # one rank's own error: that rank says it
            print(f"{os.path.basename(sys.argv[0])}: error: run {name}: {e}", file=sys.stderr,
                  flush=True)
    except Exception as e:  # a collective of this run failed because another of its ranks did
        if not launch.peer_failed(e):
            raise
        outcome.update(status="failed: another rank of this run failed (its error is above)")
    hvd.shutdown()  # this run's Horovod; the group's next run starts its own
    return outcome


class _Headed:
    """A text stream that writes each whole line to `stream` with `head` before it, at once,
    so that the lines of runs printing side by side stay whole and each names its run."""

    def __init__(self, stream, head):
        self.stream, self.head, self.part = stream, head, ""

    def write(self, text):
        lines = (self.part + text).split("\n")
        self.part = lines.pop()
        if lines:
            self.stream.write("".join(f"{self.head}{ln}\n" for ln in lines))
            self.stream.flush()
        return len(text)

    def flush(self):
        self.stream.flush()

    def isatty(self):
        return False  # no progress bar redrawn over other runs' lines


@contextlib.contextmanager
def headed(head):
    """Every line printed to stdout or stderr in the block begins with `head`."""
    out, err = _Headed(sys.stdout, head + " "), _Headed(sys.stderr, head + " ")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield
    finally:
        for s in (out, err):
            if s.part:
                s.write("\n")


def gather_outcomes(world, group, outcomes, args, runs):
    """Once every run has ended, world rank 0 gathers the outcomes (each group's rank 0 holds
    its runs') and writes the summary; every rank learns how many runs failed."""
    wait_for_every_run(world)
    gathered = world.gather(outcomes if group.Get_rank() == 0 else [], root=0)
    failed = 0
    if world.Get_rank() == 0:
        order = {name: i for i, (name, _) in enumerate(runs)}
        rows = sorted((o for part in gathered for o in part), key=lambda o: order[o["run"]])
        sweep_report.write(args.checkpoint_dir, [flag for flag, _ in args.sweep], rows)
        failed = sum(not r["status"].startswith("finished") for r in rows)
    return world.bcast(failed, root=0)


def wait_for_every_run(world):
    """Return once every process has ended its runs. MPI's blocking collectives poll, so a
    process whose group ran out of runs first would keep a core busy while the others train;
    this one looks every 0.2 s and sleeps in between."""
    done = world.Ibarrier()
    while not done.Test():
        time.sleep(0.2)
