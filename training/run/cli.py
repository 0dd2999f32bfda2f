"""The command line: the flags, their defaults and their checks.

Every trainer builds its parser here, so `--help` shows one set of flags; their
defaults come from the recipe (recipe.py). `parse_args` checks the flags, alone and
together, and a bad one becomes a UsageError: one line, exit status 2 (launch.py
prints it). The ports add their own groups: `add_horovod_args`, `add_elastic_args`,
`add_ddp_args` (the flags the ports share are in `add_distributed_args`); main_sweep.py's own
are sweeps/flags.py's.
Every trainer's flags hold every port's fields (NOT_USED fills those its parser lacks), so
the engine reads them without asking which trainer it serves.

The entry points import it, and sweeps/sweep.py to parse a run's flags; nothing here
imports Horovod or torch.distributed, and nothing here trains.
"""
import argparse
import math

import torch

import models
from training.base import recipe
from training.base.errors import UsageError
from training.base.recipe import RECIPE
from training.run import data, tracking

FAST = recipe.RECIPES["fast"]
GRAD_ALLREDUCE = ("auto", "hooks", "one", "regions")
COMPILE_MODES = ("auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

# Every trainer's flags hold every port's fields, so that the engine reads args.X without
# asking which trainer it serves; where a trainer has no such flag, its field holds the value
# that means "not used" (one process: no warm-up, one backward pass per step).
NOT_USED = {"warmup_epochs": 0.0, "batches_per_allreduce": 1, "sync_bn": False,
            "fp16_allreduce": False, "use_adasum": False, "allreduce_groups": None,
            "grad_allreduce": "hooks"}


class _Parser(argparse.ArgumentParser):
    """argparse's parser with one-line errors, and the checks a port adds to parse_args'."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.port_checks = []  # each called with the parsed flags after the common checks

    def error(self, message):
        # One line instead of argparse's usage dump; --help shows the usage.
        if "unrecognized arguments" in message and "--sweep" in message:  # not main_sweep.py's
            message += ("; --sweep is main_sweep.py's: "
                        "mpirun -np N python main_sweep.py ... --sweep FLAG=V1,V2")
        if "unrecognized arguments" in message and "--search" in message:
            message += ("; --search is main_sweep.py's: "
                        "mpirun -np N python main_sweep.py ... --search FLAG=LO:HI --trials N")
        raise UsageError(f"{message} (see --help)")


def build_parser(doc):
    p = _Parser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--arch", default="resnet18", type=str.lower,
      help="model name from models.MODELS, in any case: resnet18 or pytorch-cifar's ResNet18 "
           "(default: %(default)s)")
    a("--recipe", choices=tuple(recipe.RECIPES), default="pytorch-cifar",
      help="where --lr, --epochs, --batch-size, --lr-schedule, --nesterov, --label-smoothing "
           "and --cutout take their defaults: pytorch-cifar's recipe, or fast (fewer epochs of "
           "larger batches, for a GPU; recipe.py); a flag given keeps its own value "
           "(default: %(default)s)")
    a("--lr", type=float, default=None,
      help=f"base learning rate per process, which the ports multiply by the number of processes "
           f"and --batches-per-allreduce (default: {RECIPE['lr']} on a fresh run, "
           f"{FAST['lr']} with --recipe fast; with --resume, the checkpoint's schedule continues "
           "unless --lr is given, which restarts the cosine from this value over the remaining "
           "epochs)")
    a("--epochs", type=int, default=None,
      help=f"total epochs, including resumed ones (default: {RECIPE['epochs']}; "
           f"{FAST['epochs']} with --recipe fast)")
    a("--target-acc", type=float, default=None, metavar="ACC",
      help="end the run after the first epoch whose test accuracy reaches ACC (a fraction, e.g. "
           "0.94) and say at which epoch and after how much training time")
    a("--stop-at", type=int, default=None, metavar="EPOCH",
      help="end this run after epoch EPOCH while the schedule still spans --epochs, "
           "e.g. to fit a job's time limit; continue later with --resume")
    a("--batch-size", type=int, default=None,
      help=f"images per step per process (default: {RECIPE['batch_size']}; "
           f"{FAST['batch_size']} with --recipe fast)")
    a("--label-smoothing", type=float, default=None, metavar="EPS",
      help="label smoothing of the training loss (default: 0; "
           f"{FAST['label_smoothing']} with --recipe fast)")
    a("--weight-decay", type=float, default=None, metavar="WD",
      help="SGD's weight decay, an L2 penalty on the weights "
           f"(default: {RECIPE['weight_decay']:g}, the recipe's)")
    a("--lr-schedule", choices=("cosine", "onecycle"), default=None,
      help="cosine: from --lr to 0, stepped per epoch; onecycle: per step, linearly from 0 to --lr "
           f"over the first {RECIPE['onecycle_peak']:g} of the epochs (the recipe's "
           "onecycle_peak), then linearly to 0 (default: cosine; onecycle with --recipe fast)")
    a("--nesterov", action=argparse.BooleanOptionalAction, default=None,
      help="Nesterov momentum (default: off; on with --recipe fast)")
    a("--cutout", type=int, default=None, metavar="PIXELS",
      help="zero a PIXELS x PIXELS square at a random place in each training image (DeVries & "
           f"Taylor 2017) (default: 0, off; {FAST['cutout']} with --recipe fast)")
    a("--tta", action="store_true",
      help="evaluate with test-time augmentation: each test image's logits averaged with its "
           "mirror image's, and that with the same of the image shifted a pixel up-left and a "
           "pixel down-right (off by default: pytorch-cifar's evaluation has none)")
    a("--data-dir", default="./data", help="where cifar-10-batches-py lives (default: %(default)s)")
    a("--dataset", choices=("cifar10", "synthetic"), default="cifar10",
      help="real CIFAR-10, or generated CIFAR-format data (default: %(default)s)")
    a("--synthetic-size", type=int, default=5000,
      help="training images of --dataset synthetic; test gets a fifth (default: %(default)s)")
    a("--download", action="store_true",
      help="download CIFAR-10 (163 MB) into --data-dir where it is missing, as a fresh clone's "
           "first run needs")
    a("--loader", choices=("device", "torchvision"), default="device",
      help="device: dataset held on the training device, batched augmentation; "
           "torchvision: PIL transforms in DataLoader workers (default: %(default)s)")
    a("--workers", type=int, default=2,
      help="DataLoader workers for --loader torchvision (default: %(default)s)")
    a("--checkpoint-dir", default="./checkpoint",
      help="where ckpt.pth, best.pth, metrics.csv, tb/ and curves.svg go (default: %(default)s)")
    a("--checkpoint", default=None,
      help="file that --resume and --evaluate read (default: CHECKPOINT_DIR/ckpt.pth); "
           "pytorch-cifar checkpoints are accepted too")
    a("--mlflow", default=None, metavar="URI",
      help="also log the run to MLflow at URI (a server's http://HOST:PORT, a folder, "
           "sqlite:///FILE), from a thread of its own: flags, each epoch's metrics.csv row, "
           "curves.svg; a restarted run continues its MLflow run; a server that does not "
           "answer stops no training; credentials from MLFLOW_TRACKING_USERNAME/PASSWORD or "
           "_TOKEN (default: MLFLOW_TRACKING_URI where set; needs "
           f"{tracking.INSTALL})")
    a("--mlflow-log-model", action="store_true",
      help="with MLflow, also log best.pth at the end, and its model as an MLflow model with "
           "its signature (mlflow.pytorch.load_model loads it)")
    a("--mlflow-register", default=None, metavar="NAME",
      help="with --mlflow-log-model, register the model as a version of NAME in MLflow's "
           "model registry")
    a("--mlflow-system-metrics", action="store_true",
      help="with MLflow, also log each node's CPU, memory, disk, network (and GPU, with pynvml) "
           "use as system/HOST/... metrics; nodes other than rank 0's where they share the run "
           "folder (needs psutil)")
    a("-r", "--resume", action="store_true", help="continue from the checkpoint")
    a("--auto-resume", action="store_true",
      help="continue from CHECKPOINT_DIR/ckpt.pth when it exists, else start fresh: one command "
           "for a job's first run and its restarts (a requeued Slurm job); --lr is then the fresh "
           "start's, and a restart continues the saved schedule")
    a("--overwrite", action="store_true",
      help="start fresh even though CHECKPOINT_DIR holds a checkpoint (replaced at the first save)")
    a("--evaluate", action="store_true", help="evaluate the checkpoint on the test set and exit")
    a("--seed", type=int, default=0,
      help="seeds init, data order and augmentation (default: %(default)s)")
    a("--amp", action="store_true", help="mixed precision autocast, with a GradScaler for float16 "
                                        "(meant for CUDA; on CPU it runs, slowly)")
    a("--amp-dtype", choices=("float16", "bfloat16"), default="float16",
      help="autocast dtype for --amp (default: %(default)s)")
    a("--channels-last", action=argparse.BooleanOptionalAction, default=None,
      help="train in the channels_last (NHWC) memory format, which cuDNN runs fastest "
           "(default: on with CUDA, off on the CPU)")
    a("--compile", nargs="?", const="auto", default=None, choices=COMPILE_MODES, metavar="MODE",
      help="torch.compile the model; MODE is torch.compile's: reduce-overhead (CUDA graphs, the "
           "fastest for small steps; CUDA only), default, max-autotune, max-autotune-no-cudagraphs "
           "(without MODE: reduce-overhead on CUDA, max-autotune-no-cudagraphs there under "
           "--batches-per-allreduce > 1, default on the CPU)")
    a("--log-interval", type=int, default=50,
      help="steps between progress-bar updates; each reduces metrics once (default: %(default)s)")
    a("--profile-steps", type=int, default=0, metavar="N",
      help="time forward, backward, allreduce wait and optimizer step over the first N steps "
           "and print the medians from rank 0; adds device syncs, so off by default")
    a("--stop-signal", choices=("USR1", "USR2"), default=None,
      help="also stop cleanly on this signal, as on SIGTERM: every rank ends with one line, the "
           "last finished epoch in the checkpoint, exit status 128 + the signal's number "
           "(Slurm: sbatch --signal=USR2@120, or scancel -s USR2)")
    a("--debug", action="store_true", help="show full tracebacks on errors")
    return p


def add_distributed_args(p, title="distributed"):
    """The flags both ports have, with one meaning (main_horovod.py, main_elastic.py,
    main_ddp.py)."""
    g = p.add_argument_group(title)
    g.description = ("The LR is --lr x the number of processes x --batches-per-allreduce, reached\n"
                     "over --warmup-epochs (Goyal et al. 2017).")
    g.add_argument("--warmup-epochs", type=float, default=RECIPE["warmup_epochs"],
                   help="ramp the LR per batch from --lr to the scaled LR over this many epochs "
                        "(Goyal et al. 2017) (default: %(default)s)")
    g.add_argument("--batches-per-allreduce", type=int, default=1,
                   help="backward passes (of --batch-size each) per allreduce and step "
                        "(default: %(default)s)")
    g.add_argument("--sync-bn", action="store_true",
                   help="BatchNorm statistics over all ranks (hvd.SyncBatchNorm, "
                        "torch.nn.SyncBatchNorm under DDP); CUDA only")
    return g


def add_horovod_args(p):
    """The Horovod port's flags (main_horovod.py, main_elastic.py): the shared ones and its own."""
    g = add_distributed_args(p, "Horovod")
    g.description += ("\nOn CUDA, Horovod starts with HOROVOD_ENABLE_ASYNC_COMPLETION=1 and\n"
                     "HOROVOD_CYCLE_TIME=0.1 unless the environment sets them: a step's allreduce\n"
                     "then completes as a CUDA event the training stream waits on, not in a wait\n"
                     "that holds the host, and a gradient waits at most 0.1 ms for Horovod's next\n"
                     "cycle (training/ports/hvd_port.py). Set either variable to keep Horovod's\n"
                     "own.")
    g.add_argument("--fp16-allreduce", action="store_true",
                   help="compress gradients to float16 for the allreduce")
    g.add_argument("--use-adasum", action="store_true",
                   help="combine gradients with Adasum instead of averaging; needs Horovod's MPI "
                        "controller (mpirun, horovodrun --mpi), a power-of-two number of processes "
                        "and, with --amp, --amp-dtype bfloat16; the LR is then multiplied by the "
                        "local size on GPUs with NCCL, else by 1")
    g.add_argument("--allreduce-groups", type=int, default=None, metavar="N",
                   help="allreduce the gradients in N grouped requests per step instead of one per "
                        "tensor (DistributedOptimizer's groups; default: one per tensor)")
    g.add_argument("--grad-allreduce", choices=GRAD_ALLREDUCE, default="auto",
                   help="how gradients reach Horovod: hooks (an allreduce per tensor from "
                        "backward's hooks), one (every gradient in one allreduce after backward), "
                        "regions (with --compile: the model's blocks compiled apart, each "
                        "block's gradients reduced when its backward ends); auto: hooks eager, "
                        "and under --compile one on one host, regions across hosts or with "
                        "--allreduce-groups or --use-adasum (training/ports/hvd_port.py)")
    return p


def add_elastic_args(p):
    """The elastic port's flags (main_elastic.py): Horovod's, less what an elastic job
    cannot do, which parse_args refuses in one line."""
    add_horovod_args(p)
    p.port_checks.append(check_elastic)
    return p


def add_ddp_args(p):
    """The DDP port's flags (main_ddp.py): the shared ones."""
    add_distributed_args(p, "DDP")
    return p


def parse_args(parser, argv=None):
    """Parse the flags, fill in what they leave to the recipe and to other ports, and check
    them: each value, the flags taken together, what needs CUDA, then the port's own checks.
    A check that fails raises UsageError, one line naming the flag and the fix."""
    args = parser.parse_args(argv)
    with_defaults(args)
    for check in (check_values, check_together, check_device, *parser.port_checks):
        check(args)
    return args


def with_defaults(args):
    """Every port's fields (NOT_USED), and the chosen recipe's values where no flag is given."""
    flags = vars(args)
    for key, value in NOT_USED.items():  # one flags object for every trainer
        flags.setdefault(key, value)
    for key, value in recipe.chosen(args).items():
        if key in recipe.FROM_RECIPE and flags[key] is None:
            flags[key] = value


def check_values(args):
    """Each flag's value on its own: its range, its sign, a known --arch."""
    if not (args.weight_decay >= 0 and math.isfinite(args.weight_decay)):
        raise UsageError(f"--weight-decay must be 0 or more (got {args.weight_decay})")
    if not 0 <= args.label_smoothing < 1:
        raise UsageError("--label-smoothing must be at least 0 and below 1 "
                         f"(got {args.label_smoothing})")
    positive = {"--epochs": args.epochs, "--batch-size": args.batch_size,
                "--log-interval": args.log_interval,
                "--batches-per-allreduce": args.batches_per_allreduce}
    for flag, v in positive.items():
        if v <= 0:
            raise UsageError(f"{flag} must be positive (got {v})")
    if args.stop_at is not None and not 0 < args.stop_at <= args.epochs:
        raise UsageError(f"--stop-at must be between 1 and --epochs {args.epochs} "
                         f"(got {args.stop_at})")
    if args.target_acc is not None and not 0 < args.target_acc <= 1:
        raise UsageError(f"--target-acc is a fraction of the test set between 0 and 1, e.g. 0.94 "
                         f"(got {args.target_acc})")
    if args.lr is not None and not (args.lr > 0 and math.isfinite(args.lr)):
        raise UsageError(f"--lr must be a positive number (got {args.lr})")
    if args.allreduce_groups is not None and args.allreduce_groups <= 0:
        raise UsageError(f"--allreduce-groups must be positive (got {args.allreduce_groups})")
    if args.workers < 0 or args.profile_steps < 0 or args.warmup_epochs < 0:
        raise UsageError("--workers, --profile-steps and --warmup-epochs must not be negative")
    if not 0 <= args.cutout <= 32:
        raise UsageError(f"--cutout is a side in pixels between 0 (off) and 32 (got {args.cutout})")
    data.check_synthetic_size(args.synthetic_size)
    tracking.check_flags(args)
    if args.arch not in models.MODELS:
        raise UsageError(f"unknown --arch {args.arch!r}; choose one of: "
                         + ", ".join(sorted(models.MODELS)))


def check_together(args):
    """Flags that contradict each other."""
    if args.grad_allreduce == "one" and (args.use_adasum or args.allreduce_groups is not None):
        raise UsageError("--grad-allreduce one reduces every gradient in one allreduce, and "
                         "--use-adasum and --allreduce-groups work per tensor: drop one of them")
    if args.grad_allreduce == "regions" and not args.compile:
        raise UsageError("--grad-allreduce regions compiles the model block by block: add "
                         "--compile, or drop it")
    if args.cutout and args.loader != "device":
        raise UsageError("--cutout is done by the device loader; drop --loader torchvision or "
                         "--cutout")
    if args.use_adasum and args.amp and args.amp_dtype == "float16":
        raise UsageError("--use-adasum cannot work with --amp's float16 GradScaler (Horovod's "
                         "Adasum optimizer cannot be synchronized early); add --amp-dtype bfloat16 "
                         "or drop one")
    if args.compile in ("reduce-overhead", "max-autotune") and args.batches_per_allreduce > 1:
        raise UsageError(f"--compile {args.compile} captures CUDA graphs, whose gradients are not "
                         "to be trusted when they accumulate over --batches-per-allreduce > 1; use "
                         "--compile alone (which then picks max-autotune-no-cudagraphs) or "
                         "--batches-per-allreduce 1")
    if (args.resume or args.auto_resume) and args.evaluate:
        raise UsageError("--resume and --evaluate do not go together: --evaluate reads the "
                         "checkpoint on its own")
    if sum((args.resume, args.auto_resume, args.overwrite)) > 1:
        raise UsageError("--resume, --auto-resume and --overwrite do not go together: pick one")


def check_device(args):
    """Settings that need CUDA, refused where there is none."""
    if args.sync_bn and not torch.cuda.is_available():
        raise UsageError("--sync-bn needs CUDA: SyncBatchNorm (Horovod's and PyTorch's) runs on "
                         "GPUs only; drop it on CPU")
    if args.compile in ("reduce-overhead", "max-autotune") and not torch.cuda.is_available():
        raise UsageError(f"--compile {args.compile} captures CUDA graphs and needs CUDA; on the "
                         "CPU use --compile (default mode) or --compile max-autotune-no-cudagraphs")


def check_elastic(args):
    """What main_elastic.py cannot do (add_elastic_args adds this check)."""
    if args.evaluate:
        raise UsageError("main_elastic.py only trains; evaluate with main.py --evaluate")
    if args.use_adasum:
        raise UsageError("--use-adasum needs Horovod's MPI controller, and elastic runs use "
                         "gloo; use main_horovod.py for Adasum")
    if args.grad_allreduce not in ("auto", "hooks"):
        raise UsageError("main_elastic.py reduces gradients from backward's hooks only; "
                         "drop --grad-allreduce or use main_horovod.py")


def last_epoch(args):
    """Where this run stops: --stop-at, else --epochs."""
    return args.stop_at or args.epochs
