"""main_sweep.py --sweep: a grid of runs, one per combination of values, as one MPI job.

    mpirun -np 8 python main_sweep.py --arch resnet18 --sweep lr=0.05,0.1,0.2,0.4 --sweep seed=0,1
    mpirun -np 2 python main_sweep.py --sweep seed=0,1,2,3,4 --sweep lr=0.05,0.1 --ranks-per-run 1

The product of the --sweep lists makes the runs. The job's processes form groups of
--ranks-per-run consecutive ranks (groups.py; by default the world size over the runs, where
that divides, else 1), and each group trains runs one after another, each the next that no
group has taken yet (run_queue.py), until none is left: a long run holds back only its own
group. Each run is an ordinary main_horovod.py run of its group, its files in
CHECKPOINT_DIR/<run>/ (ckpt.pth, best.pth, metrics.csv, tb/, curves.svg), every line it prints
headed by its settings. The sweep adds --auto-resume (unless --resume or --overwrite is
given), so every run resumes alone, and a re-submitted sweep continues the runs that are not
finished and trains nothing more of those that are. CHECKPOINT_DIR must be a folder every host
sees: a run may be continued by another group than the one that started it. World rank 0
gathers every run's outcome and writes the summary (report.py).

A run that fails, on all of its ranks alike (a divergence, a value that does not suit it) or
on one of them (its checkpoint, read by its rank 0 alone, is corrupt; the others' collectives
then fail), ends alone; its group takes the next run, and the job exits 1 at the end. A crash
of one rank, and a stop signal, end the whole job, as they end any run; each run keeps its
last finished epoch.
"""
import itertools
import os

from sweeps import flags, groups, report
from sweeps.run_queue import RunQueue
from training.run import cli


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
    extra = [f"--{flag}={value}" for flag, value in combo]
    extra += ["--checkpoint-dir", os.path.join(args.checkpoint_dir, name)]
    if not (args.resume or args.auto_resume or args.overwrite):
        extra.append("--auto-resume")
    return [*flags.run_flags(argv), *extra]


def run(main, args, argv):
    """main_sweep.py --sweep: every check first (check_sweep), then the job's course
    (groups.run_job of a GridJob); RunsFailed where a run failed."""
    from mpi4py import MPI
    runs, per_run = check_sweep(args, argv, MPI.COMM_WORLD.Get_size())
    parent = groups.nested(args)  # the sweep's MLflow run, with --mlflow
    groups.run_job(GridJob(main, args, argv, runs, per_run, parent))


class GridJob(groups.Job):
    """The sweep's course: the queue reset on world rank 0, each group training runs from it in
    the queue's order until none is left (train_in_group each), and world rank 0 writing the
    summary of every run's outcome (summarize)."""

    def __init__(self, main, args, argv, runs, per_run, parent):
        self.main, self.args, self.argv, self.runs = main, args, argv, runs
        self.per_run, self.parent = per_run, parent
        self.queue = RunQueue(args.checkpoint_dir)

    def prepare(self):
        self.queue.reset()

    def source(self, index, prepared):
        return self

    def take(self, ranks):
        """The next run no group has taken, now this group's; None once none is left."""
        index = self.queue.take()
        return self.runs[index] if index < len(self.runs) else None

    def train(self, group, source, run, ranks):
        name, combo = run
        argv = run_argv(self.args, self.argv, name, combo)
        return dict(train_in_group(self.main, argv, name, combo, group), ranks=ranks)

    def summarize(self, outcomes):
        return summarize(self.args, self.runs, outcomes, self.parent)


def check_sweep(args, argv, processes):
    """(the runs, the processes per run), once every check that can fail for the whole sweep
    has passed on every rank alike, before any work: the controller, each run's flags, the
    ranks per run."""
    groups.check_controller()
    runs = combinations(args.sweep)
    parser = cli.add_horovod_args(cli.build_parser(""))
    for name, combo in runs:  # every run's flags are sound, or nothing starts
        cli.parse_args(parser, run_argv(args, argv, name, combo))
    return runs, groups.ranks_per_run(args, len(runs), processes)


def train_in_group(main, argv, name, combo, group):
    """Train one run in its group (groups.run_in_group), every line it prints headed by its
    settings. Returns the run's outcome: its values, and its figures or why it failed."""
    history, why = groups.run_in_group(main, argv, group, label(combo), f"run {name}")
    outcome = {"run": name, **dict(combo)}
    if why is None:
        outcome.update(report.summary(history), status="finished")
    else:
        outcome.update(status=f"failed: {why}")
    return outcome


def summarize(args, runs, outcomes, parent=None):
    """World rank 0, once every run has ended: sweep.csv, the table and sweep.svg, in the order
    of the --sweep lists, also in the sweep's MLflow run (`parent`) where there is one; why the
    job failed (how many runs did), or None."""
    order = {name: i for i, (name, _) in enumerate(runs)}
    rows = sorted(outcomes, key=lambda o: order[o["run"]])
    report.write_grid(args.checkpoint_dir, [flag for flag, _ in args.sweep], rows)
    if parent is not None:
        parent.finish(args.checkpoint_dir, files=("sweep.csv", "sweep.svg"))
    failed = sum(not r["status"].startswith("finished") for r in rows)
    summary = os.path.join(args.checkpoint_dir, "sweep.csv")
    return (f"{failed} of {len(runs)} runs failed (their errors are above, and their rows in "
            f"{summary}); the others finished") if failed else None
