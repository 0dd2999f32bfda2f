"""main_sweep.py's --sweep: one MPI job split into independent Horovod runs, one per
combination of values.

    mpirun -np 8 python main_sweep.py --arch resnet18 --sweep lr=0.05,0.1,0.2,0.4 --sweep seed=0,1

The product of the --sweep lists makes the runs (here 8). mpi4py splits MPI.COMM_WORLD into
as many equal groups of consecutive ranks, and each group trains one run as an ordinary
main_horovod.py run of its own: hvd.init(comm=group), its files in CHECKPOINT_DIR/<run>/
(ckpt.pth, best.pth, metrics.csv, tb/, curves.png). The sweep adds --auto-resume (unless
--resume or --overwrite is given), so every run resumes alone, and a re-submitted sweep
continues the runs that are not finished and trains nothing more of those that are. World
rank 0 gathers every run's outcome and writes CHECKPOINT_DIR/sweep.csv and sweep.png.

A run that fails, on all of its ranks alike (a divergence, a value that does not suit it) or
on one of them (its checkpoint, read by its rank 0 alone, is corrupt; the others' collectives
then fail), ends its own group; the other runs go on, and the job exits 1 at the end. A crash
of one rank, and a stop signal, end the whole job, as they end any run; each run keeps its
last finished epoch.
"""
import csv
import io
import itertools
import os
import statistics
import sys
import time

from training import cli, devices, launch, safeio
from training.errors import RunsFailed, TrainerError, UsageError

COLUMNS = ("run", "status", "epochs", "final_test_acc", "best_test_acc", "train_time_s")


def combinations(axes):
    """The runs of --sweep's lists: [(name, [(flag, value), ...])], the last list varying fastest.
    The name (e.g. lr0.1_seed1) is the run's folder under --checkpoint-dir."""
    flags = [flag for flag, _ in axes]
    runs = []
    for values in itertools.product(*(values for _, values in axes)):
        combo = list(zip(flags, values))
        runs.append(("_".join(f"{flag}{value}" for flag, value in combo), combo))
    return runs


def run_argv(args, argv, name, combo):
    """The flags of one run: the job's without --sweep, then the run's values and folder (the
    last wins)."""
    argv, kept = list(sys.argv[1:] if argv is None else argv), []
    while argv:
        a = argv.pop(0)
        if a == "--sweep":
            argv.pop(0)
        elif not a.startswith("--sweep="):
            kept.append(a)
    extra = [f"--{flag}={value}" for flag, value in combo]
    extra += ["--checkpoint-dir", os.path.join(args.checkpoint_dir, name)]
    if not (args.resume or args.auto_resume or args.overwrite):
        extra.append("--auto-resume")
    return [*kept, *extra]


def node_slot():
    """This process's rank among the job's processes on its host, and their number."""
    from mpi4py import MPI
    node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_rank(), node.Get_size()
    finally:
        node.Free()


def take_host_share(slot, slots):
    """Show this process only its share of the host, as a launcher's binding does: the GPU of
    its slot where the host has a GPU for each (CUDA_VISIBLE_DEVICES, before CUDA starts), and
    its share of the cores (its affinity). A run's port then places itself within that share
    by hvd.local_rank(), which counts within the run's group: two runs on one host would
    otherwise both take GPU 0 and the same cores."""
    import torch
    gpus = torch.cuda.device_count()  # NVML's count: CUDA is not started by it
    if gpus > 1 and gpus >= slots:
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = shown.split(",") if shown else [str(i) for i in range(gpus)]
        os.environ["CUDA_VISIBLE_DEVICES"] = ids[slot * gpus // slots]
    cores, _ = devices.core_share(devices.ordered_cores(os.sched_getaffinity(0)), slot, slots)
    os.sched_setaffinity(0, cores)


def check_controller():
    """The split needs Horovod on MPI; the gloo controller has no communicator to split."""
    import horovod.torch as hvd
    if os.environ.get("HOROVOD_CONTROLLER") == "gloo" or not hvd.mpi_built():
        raise UsageError("--sweep splits an MPI job with mpi4py and this job runs on Horovod's "
                         "gloo controller; launch with mpirun, srun --mpi=pmix or horovodrun --mpi")


def run(main, args, argv):
    """main_sweep.py: every check first (check_sweep), then this process's run in its group
    (train_in_group), then the outcomes gathered on world rank 0, which writes sweep.csv and
    sweep.png (gather_outcomes), and the job's status (RunsFailed when a run failed)."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    runs = check_sweep(args, argv, world.Get_size())
    take_host_share(*node_slot())
    per_run = world.Get_size() // len(runs)
    index = world.Get_rank() // per_run
    group = world.Split(index, world.Get_rank())
    outcome = train_in_group(main, run_argv(args, argv, *runs[index]), runs[index], group)
    failed = gather_outcomes(world, group, outcome, args)
    group.Free()
    if failed:
        summary = os.path.join(args.checkpoint_dir, "sweep.csv")
        raise RunsFailed(f"{failed} of {len(runs)} runs failed (their errors are above, and their "
                         f"rows in {summary}); the others finished")


def check_sweep(args, argv, processes):
    """The runs, once every check that can fail for the whole sweep has passed on every rank
    alike, before any work: the controller, each run's flags, the world size."""
    check_controller()
    runs = combinations(args.sweep)
    parser = cli.add_horovod_args(cli.build_parser(""))
    for name, combo in runs:  # every run's flags are sound, or nothing starts
        cli.parse_args(parser, run_argv(args, argv, name, combo))
    if processes % len(runs):
        raise UsageError(f"--sweep makes {len(runs)} runs, which do not divide the {processes} "
                         f"processes; launch a multiple of {len(runs)} "
                         f"(mpirun -np {len(runs)} or more)")
    return runs


def train_in_group(main, argv, run, group):
    """Train one run as an ordinary main_horovod.py run of the ranks in `group`: Horovod
    started on the group's communicator (main's own hvd.init() then finds it started), and
    shut down after, whatever the run's end. Returns the run's outcome for sweep.csv."""
    import horovod.torch as hvd
    name, combo = run
    outcome = {"run": name, **dict(combo)}
    hvd.init(comm=group)
    try:
        _, history = main(argv)
        outcome.update(summary(history), status="finished")
    except TrainerError as e:
        outcome.update(status=f"failed: {e}")
        if group.Get_rank() == 0 or not e.every_rank:  # one rank's own error: that rank says it
            print(f"{os.path.basename(sys.argv[0])}: error: run {name}: {e}", file=sys.stderr,
                  flush=True)
    except Exception as e:  # a collective of this run failed because another of its ranks did
        if not launch.peer_failed(e):
            raise
        outcome.update(status="failed: another rank of this run failed (its error is above)")
    finally:
        hvd.shutdown()  # this run's Horovod; the other runs may still be training
    return outcome


def gather_outcomes(world, group, outcome, args):
    """Once every run has ended, world rank 0 gathers each run's outcome (from its group's rank
    0) and writes the summary; every rank learns how many runs failed."""
    wait_for_every_run(world)
    outcomes = world.gather(outcome if group.Get_rank() == 0 else None, root=0)
    failed = 0
    if world.Get_rank() == 0:
        rows = [o for o in outcomes if o is not None]
        write_summary(args.checkpoint_dir, [flag for flag, _ in args.sweep], rows)
        failed = sum(not r["status"].startswith("finished") for r in rows)
    return world.bcast(failed, root=0)


def wait_for_every_run(world):
    """Return once every process has ended its run. MPI's blocking collectives poll, so a
    process whose run ended first would keep a core busy while the others train; this one
    looks every 0.2 s and sleeps in between."""
    done = world.Ibarrier()
    while not done.Test():
        time.sleep(0.2)


def summary(history):
    """A finished run's figures, from its metric rows."""
    if not history:
        return {"epochs": 0}
    return {"epochs": history[-1]["epoch"], "final_test_acc": history[-1]["test_acc"],
            "best_test_acc": max(r["test_acc"] for r in history),
            "train_time_s": history[-1].get("train_time_s")}


def write_summary(folder, flags, rows):
    """sweep.csv (one row per run, written atomically), sweep.png, and the table on stdout."""
    os.makedirs(folder, exist_ok=True)
    columns = ["run", *flags, *COLUMNS[1:]]
    text = io.StringIO()
    writer = csv.DictWriter(text, columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    safeio.atomic_write(os.path.join(folder, "sweep.csv"),
                        lambda f: f.write(text.getvalue().encode()))
    settings = by_setting(flags, rows)
    print(table(settings), flush=True)
    plot(os.path.join(folder, "sweep.png"), settings)


def by_setting(flags, rows):
    """[(setting, final accuracies of its finished runs, runs)]: runs that differ only in their
    seed share a setting, so their spread is the error bar."""
    keep = [f for f in flags if f != "seed"]
    groups = {}
    for r in rows:
        setting = " ".join(f"{f}={r[f]}" for f in keep) or "all runs"
        groups.setdefault(setting, []).append(r)
    return [(s, [r["final_test_acc"] for r in rs if r["status"] == "finished"], rs)
            for s, rs in groups.items()]


def mean_std(accs):
    if not accs:
        return "failed"
    if len(accs) == 1:
        return f"{accs[0]:.4f}"
    return f"{statistics.mean(accs):.4f} ± {statistics.stdev(accs):.4f}"


def table(settings):
    """The end-of-sweep table: final test accuracy per setting, mean ± std over its seeds."""
    width = max(len(s) for s, _, _ in settings)
    lines = [f"{'setting':<{width}}  runs  final test acc", f"{'-' * width}  ----  --------------"]
    for s, accs, rs in settings:
        failed = len(rs) - len(accs)
        lines.append(f"{s:<{width}}  {len(rs):>4}  {mean_std(accs)}"
                     + (f"  ({failed} failed)" if failed else ""))
    return "\n".join(lines)


def plot(path, settings):
    """sweep.png: final test accuracy by setting, error bars of one std over seeds."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(max(4, 1 + 0.8 * len(settings)), 3.5))
    for i, (_, accs, _) in enumerate(settings):
        if accs:
            spread = statistics.stdev(accs) if len(accs) > 1 else 0
            ax.errorbar(i, statistics.mean(accs), yerr=spread, fmt="o", capsize=4, color="C0")
    ax.set_xticks(range(len(settings)), [s for s, _, _ in settings], rotation=30, ha="right")
    ax.set_ylabel("final test accuracy")
    fig.tight_layout()
    safeio.atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=80))
    plt.close(fig)
