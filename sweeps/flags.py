"""main_sweep.py's flags: the Horovod port's (training/run/cli.py), --sweep (a grid) and --search
(a study), their grammar and their checks; and the flags every run of a job gets (run_flags)."""
import argparse
import math
import sys
import typing

from training.base.errors import UsageError
from training.run import cli


def parse_args(doc, argv=None):
    """main_sweep.py's flags, parsed and checked: the trainer's checks, then the job's own."""
    args = cli.parse_args(add_args(cli.build_parser(doc)), argv)
    check(args)
    return args


def add_args(p):
    """main_sweep.py's flags: the Horovod port's, --sweep (a grid) and --search (a study)."""
    cli.add_horovod_args(p)
    g = p.add_argument_group("sweep")
    g.add_argument("--sweep", action="append", type=sweep_axis, metavar="FLAG=V1,V2,...",
                   help="train one independent run per combination of the values (repeat "
                        "--sweep for a product), each on --ranks-per-run of the processes, in "
                        "CHECKPOINT_DIR/<run>/, summed up in CHECKPOINT_DIR/sweep.csv; FLAG is "
                        "one of " + ", ".join(SWEEPABLE))
    g.add_argument("--ranks-per-run", type=int, default=None, metavar="K",
                   help="processes per run: the job's processes form groups of K, and each group "
                        "trains runs one after another, the next one left, until none is (default: "
                        "the processes over the runs, where that divides, else 1)")
    g = p.add_argument_group("search")
    g.add_argument("--search", action="append", type=search_axis, metavar="FLAG=RANGE",
                   help="search FLAG with Optuna instead of a grid (repeat --search for each "
                        "flag): FLAG=LO:HI (uniform), FLAG=log:LO:HI (log-uniform) or "
                        "FLAG=V1,V2,... (one of the values); each trial is a run in "
                        "CHECKPOINT_DIR/trial-<n>/, the study CHECKPOINT_DIR/study.journal; FLAG "
                        "is one of " + ", ".join(SEARCHABLE))
    g.add_argument("--trials", type=int, default=None, metavar="N",
                   help="the trials a --search study ends with, those of earlier jobs on the same "
                        "study included")
    g.add_argument("--pruner", choices=("median", "hyperband", "none"), default="median",
                   help="what ends a trial early after an epoch: Optuna's median pruner (below the "
                        "median of the completed trials at that epoch), Hyperband, or none "
                        "(default: %(default)s)")
    g.add_argument("--sampler", choices=("tpe", "random"), default="tpe",
                   help="how Optuna picks a trial's values, seeded by --seed: TPE, or at random "
                        "(default: %(default)s)")
    g.add_argument("--storage", default=None, metavar="postgresql://USER@HOST/DB",
                   help="keep the study in PostgreSQL instead of CHECKPOINT_DIR/study.journal: "
                        "for jobs on several hosts at once, or a filesystem whose locks do not "
                        "work across hosts (docs/MULTI_NODE.md)")
    g.add_argument("--heartbeat", type=int, default=60, metavar="SECONDS",
                   help="with --storage, how often a trial's group says it is alive; a trial "
                        "silent for twice that is taken up by another group (default: "
                        "%(default)s)")
    return p


SWEEPABLE = ("lr", "seed", "batch-size", "warmup-epochs", "arch", "epochs", "label-smoothing",
             "weight-decay")
# What --search takes, and the type of its values: a range of numbers, or a list of choices.
SEARCHABLE = {"lr": float, "weight-decay": float, "label-smoothing": float,
              "warmup-epochs": float, "batch-size": int, "arch": str}
# main_sweep.py's own flags, each with a value: the flags its runs do not get.
SWEEP_FLAGS = ("--sweep", "--ranks-per-run", "--search", "--trials", "--pruner", "--sampler",
               "--storage", "--heartbeat")


def run_flags(argv=None):
    """main_sweep.py's flags (sys.argv's where argv is None) without its own (SWEEP_FLAGS):
    the flags every run of the job gets."""
    return without(list(sys.argv[1:] if argv is None else argv), SWEEP_FLAGS)


def without(argv, names):
    """argv less the flags `names`, each of which takes a value (`--flag V` or `--flag=V`)."""
    argv, kept = list(argv), []
    while argv:
        a = argv.pop(0)
        if a in names:
            argv.pop(0)
        elif not a.startswith(tuple(f"{name}=" for name in names)):
            kept.append(a)
    return kept


def sweep_axis(text):
    """--sweep FLAG=V1,V2,...: (FLAG without its dashes, [values as given])."""
    flag, sep, values = text.partition("=")
    flag = flag.removeprefix("--")
    if not sep or flag not in SWEEPABLE or not all(values.split(",")):
        raise argparse.ArgumentTypeError("--sweep takes FLAG=V1,V2,... with FLAG one of "
                                         + ", ".join(SWEEPABLE))
    return flag, values.split(",")


class SearchAxis(typing.NamedTuple):
    """One --search flag: FLAG (without its dashes), its kind ("uniform" or "log": values is
    (LO, HI) of the flag's type; "choice": values are the choices as given)."""
    flag: str
    kind: str
    values: tuple


def search_axis(text):
    """--search FLAG=LO:HI, FLAG=log:LO:HI or FLAG=V1,V2,...: a SearchAxis."""
    flag, sep, spec = text.partition("=")
    flag = flag.removeprefix("--")
    if not sep or flag not in SEARCHABLE or not spec:
        raise argparse.ArgumentTypeError("--search takes FLAG=LO:HI, FLAG=log:LO:HI or "
                                         "FLAG=V1,V2,... with FLAG one of " + ", ".join(SEARCHABLE))
    kind = SEARCHABLE[flag]
    if ":" not in spec:
        choices = tuple(spec.split(","))
        if not all(choices) or len(set(choices)) < len(choices):
            raise argparse.ArgumentTypeError(f"{flag}={spec}: the choices V1,V2,... must be "
                                             "different and none empty")
        if len(choices) == 1:
            raise argparse.ArgumentTypeError(f"{flag}={spec}: one value is no search; pass "
                                             f"--{flag} {spec}, or give a range or values")
        return SearchAxis(flag, "choice", choices)
    log = spec.startswith("log:")
    ends = spec.removeprefix("log:").split(":")
    malformed = (f"{flag}={spec} is not a range; give {flag}=LO:HI or {flag}=log:LO:HI, two "
                 f"{'integers' if kind is int else 'numbers'} with LO below HI")
    if kind is str:
        raise argparse.ArgumentTypeError(f"{flag}={spec}: {flag} takes a list of values, e.g. "
                                         f"{flag}=resnet18,mobilenetv2")
    try:
        lo, hi = (kind(e) for e in ends)
    except ValueError:
        raise argparse.ArgumentTypeError(malformed) from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise argparse.ArgumentTypeError(malformed)
    if log and lo <= 0:
        raise argparse.ArgumentTypeError(f"{flag}={spec}: a log range starts above 0")
    return SearchAxis(flag, "log" if log else "uniform", (lo, hi))


def check(args):
    """The job's flags, alone and with the trainer's."""
    if args.ranks_per_run is not None and args.ranks_per_run <= 0:
        raise UsageError(f"--ranks-per-run must be positive (got {args.ranks_per_run})")
    if args.sweep:
        swept = [flag for flag, _ in args.sweep]
        if len(set(swept)) < len(swept):
            raise UsageError("each --sweep FLAG may come once; give all its values in one list")
        if args.evaluate or args.checkpoint:
            raise UsageError("--sweep trains a run per folder; evaluate a run with main.py "
                             "--evaluate --checkpoint-dir CHECKPOINT_DIR/<run>")
    check_search(args)


def check_search(args):
    """--search's flags, alone and with the others."""
    if args.trials is not None and args.trials <= 0:
        raise UsageError(f"--trials must be positive (got {args.trials})")
    if args.heartbeat < 1:
        raise UsageError(f"--heartbeat must be at least 1 second (got {args.heartbeat})")
    if not args.search:
        if args.trials is not None:
            raise UsageError("--trials counts the trials of a --search; add --search FLAG=LO:HI")
        if args.storage:
            raise UsageError("--storage keeps the study of a --search; add --search FLAG=LO:HI")
        return
    if args.sweep:
        raise UsageError("--search and --sweep do not go together: one job is a grid (--sweep) or "
                         "a search (--search); drop one")
    searched = [axis.flag for axis in args.search]
    if len(set(searched)) < len(searched):
        raise UsageError("each --search FLAG may come once")
    if args.trials is None:
        raise UsageError("--search needs --trials N, the number of trials the study ends with")
    if args.evaluate or args.checkpoint:
        raise UsageError("--search trains a trial per folder; evaluate a trial with main.py "
                         "--evaluate --checkpoint-dir CHECKPOINT_DIR/trial-<n>")
    if args.resume or args.overwrite:
        raise UsageError("--search resumes its study by itself: submit the same command again "
                         "without --resume or --overwrite; a new study needs another "
                         "--checkpoint-dir")
    if args.stop_at is not None or args.target_acc is not None:
        raise UsageError("--search trains every trial to --epochs unless the pruner ends it; "
                         "drop --stop-at and --target-acc")
