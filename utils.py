"""What main.py and main_horovod.py share: settings, the epoch loop, checkpoints and metrics.

Nothing here knows about Horovod. The port passes in what differs as values:
its rank and world size, an allreduce function, and an LR scale. Importing
this module only defines things.
"""
import argparse
import contextlib
import csv
import math
import os
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

import data
import models
from errors import TrainerError, UsageError

CHECKPOINT_FORMAT = 1
METRICS_COLUMNS = ("epoch", "lr", "train_loss", "train_acc", "test_loss", "test_acc",
                   "epoch_time_s", "images_per_s", "world_size")


# ============================================================================
# Settings

class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # One line instead of argparse's usage dump; --help shows the usage.
        raise UsageError(f"{message} (see --help)")


def build_parser(doc):
    p = _Parser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--arch", default="resnet18", help="model name from models.MODELS (default: %(default)s)")
    a("--lr", type=float, default=None,
      help="base learning rate per process (default: 0.1 on a fresh run; with --resume, "
           "the checkpoint's schedule continues unless --lr is given, which restarts the "
           "cosine from this value over the remaining epochs)")
    a("--epochs", type=int, default=200, help="total epochs, including resumed ones (default: %(default)s)")
    a("--stop-at", type=int, default=None, metavar="EPOCH",
      help="end this run after epoch EPOCH while the schedule still spans --epochs, "
           "e.g. to fit a job's time limit; continue later with --resume")
    a("--batch-size", type=int, default=128, help="images per step per process (default: %(default)s)")
    a("--data-dir", default="./data", help="where cifar-10-batches-py lives (default: %(default)s)")
    a("--dataset", choices=("cifar10", "synthetic"), default="cifar10",
      help="real CIFAR-10, or generated CIFAR-format data (default: %(default)s)")
    a("--synthetic-size", type=int, default=5000,
      help="training images of --dataset synthetic; test gets a fifth (default: %(default)s)")
    a("--download", action="store_true", help="download CIFAR-10 into --data-dir if missing")
    a("--loader", choices=("device", "torchvision"), default="device",
      help="device: dataset held on the training device, batched augmentation; "
           "torchvision: PIL transforms in DataLoader workers (default: %(default)s)")
    a("--workers", type=int, default=2, help="DataLoader workers for --loader torchvision (default: %(default)s)")
    a("--checkpoint-dir", default="./checkpoint",
      help="where ckpt.pth, best.pth, metrics.csv, tb/ and curves.png go (default: %(default)s)")
    a("--checkpoint", default=None,
      help="file that --resume and --evaluate read (default: CHECKPOINT_DIR/ckpt.pth); "
           "pytorch-cifar checkpoints are accepted too")
    a("-r", "--resume", action="store_true", help="continue from the checkpoint")
    a("--overwrite", action="store_true",
      help="start fresh even though CHECKPOINT_DIR holds a checkpoint (replaced at the first save)")
    a("--evaluate", action="store_true", help="evaluate the checkpoint on the test set and exit")
    a("--seed", type=int, default=0, help="seeds init, data order and augmentation (default: %(default)s)")
    a("--amp", action="store_true", help="mixed precision autocast, with a GradScaler for float16 "
                                        "(meant for CUDA; on CPU it runs, slowly)")
    a("--amp-dtype", choices=("float16", "bfloat16"), default="float16",
      help="autocast dtype for --amp (default: %(default)s)")
    a("--compile", action="store_true", help="torch.compile the model")
    a("--log-interval", type=int, default=50,
      help="steps between progress-bar updates; each reduces metrics once (default: %(default)s)")
    a("--profile-steps", type=int, default=0, metavar="N",
      help="time forward, backward, allreduce wait and optimizer step over the first N steps "
           "and print the medians from rank 0; adds device syncs, so off by default")
    a("--debug", action="store_true", help="show full tracebacks on errors")
    return p


def add_horovod_args(p):
    g = p.add_argument_group("Horovod")
    g.add_argument("--warmup-epochs", type=float, default=5,
                   help="ramp the LR per batch from --lr to the scaled LR over this many epochs "
                        "(Goyal et al. 2017) (default: %(default)s)")
    g.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to float16 for the allreduce")
    g.add_argument("--use-adasum", action="store_true", help="combine gradients with Adasum instead of averaging")
    g.add_argument("--batches-per-allreduce", type=int, default=1,
                   help="backward passes (of --batch-size each) per allreduce and step (default: %(default)s)")
    g.add_argument("--sync-bn", action="store_true", help="BatchNorm statistics over all ranks (hvd.SyncBatchNorm)")
    return p


def parse_args(parser, argv=None):
    args = parser.parse_args(argv)
    positive = {"--epochs": args.epochs, "--batch-size": args.batch_size, "--log-interval": args.log_interval,
                "--synthetic-size": args.synthetic_size,
                "--batches-per-allreduce": getattr(args, "batches_per_allreduce", 1)}
    for flag, v in positive.items():
        if v <= 0:
            raise UsageError(f"{flag} must be positive (got {v})")
    if args.stop_at is not None and not 0 < args.stop_at <= args.epochs:
        raise UsageError(f"--stop-at must be between 1 and --epochs {args.epochs} (got {args.stop_at})")
    if args.lr is not None and not (args.lr > 0 and math.isfinite(args.lr)):
        raise UsageError(f"--lr must be a positive number (got {args.lr})")
    if args.workers < 0 or args.profile_steps < 0 or getattr(args, "warmup_epochs", 0) < 0:
        raise UsageError("--workers, --profile-steps and --warmup-epochs must not be negative")
    if args.synthetic_size % 5:
        raise UsageError(f"--synthetic-size must be a multiple of 5 (got {args.synthetic_size}): "
                         "it is split over 5 batch files")
    if args.arch not in models.MODELS:
        raise UsageError(f"unknown --arch {args.arch!r}; choose one of: {', '.join(sorted(models.MODELS))}")
    if getattr(args, "use_adasum", False) and args.amp and args.amp_dtype == "float16":
        raise UsageError("--use-adasum cannot work with --amp's float16 GradScaler (Horovod's Adasum "
                         "optimizer cannot be synchronized early); add --amp-dtype bfloat16 or drop one")
    if getattr(args, "sync_bn", False) and not torch.cuda.is_available():
        raise UsageError("--sync-bn needs CUDA: hvd.SyncBatchNorm runs on GPUs only; drop it on CPU")
    if args.resume and args.evaluate:
        raise UsageError("--resume and --evaluate do not go together: --evaluate reads the checkpoint on its own")
    if args.resume and args.overwrite:
        raise UsageError("--resume and --overwrite do not go together: pick one")
    return args


def last_epoch(args):
    """Where this run stops: --stop-at, else --epochs."""
    return args.stop_at or args.epochs


def check_adasum(args, size, mpi_enabled):
    """Horovod's Adasum runs only on its MPI controller and at power-of-two sizes."""
    if not getattr(args, "use_adasum", False):
        return
    if not mpi_enabled:
        raise UsageError("--use-adasum needs Horovod's MPI controller: launch with horovodrun --mpi or mpirun")
    if size & (size - 1):
        raise UsageError(f"--use-adasum needs a power-of-two number of processes, not {size}")


def checkpoint_path(args):
    return args.checkpoint or os.path.join(args.checkpoint_dir, "ckpt.pth")


def launcher_rank():
    """This process's rank as the launcher set it, known before hvd.init()."""
    for var in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


def run_cli(main, argv=None):
    """Run main(); turn a TrainerError into one line on stderr and an exit status."""
    argv = sys.argv[1:] if argv is None else argv
    prog = os.path.basename(sys.argv[0] or "main.py")
    launched = any(v in os.environ for v in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"))
    where = f" (rank {launcher_rank()})" if launched else ""
    try:
        main(argv)
        return 0
    except TrainerError as e:
        if "--debug" in argv:
            raise
        # Every rank hits a usage error alike, so rank 0 alone says it. Other
        # errors may be one rank's alone, so each says which rank it is.
        if not isinstance(e, UsageError):
            print(f"{prog}: error{where}: {e}", file=sys.stderr, flush=True)
        elif launcher_rank() == 0:
            print(f"{prog}: error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    except Exception as e:
        # Horovod raises this on the surviving ranks when another rank failed or
        # died; that rank has said why. Matched by name: utils does not import Horovod.
        if type(e).__name__ != "HorovodInternalError" or "--debug" in argv:
            raise
        print(f"{prog}: error{where}: stopping because another rank failed or exited "
              "(its error is above)", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; the last finished epoch is in the checkpoint", file=sys.stderr)
        return 130


# ============================================================================
# Device, model, optimiser, schedule

def pick_device(local_rank=0, local_size=1):
    """The GPU numbered local_rank, or the CPU with its cores split among the
    local_size processes on this host, so they do not oversubscribe it.

    On the CPU, a process that its launcher did not bind to cores (horovodrun
    does not; mpirun does) is pinned, every thread of it, to its own share of the
    cores it may use, and runs that many torch threads. Unpinned, the ranks'
    compute threads and Horovod's background threads wander between cores
    (measured at np=2 on 2 cores: 20% fewer images/s). With more local processes
    than cores none is pinned, and each runs one thread. OMP_NUM_THREADS set by
    the user turns all this off. Called again after an elastic reset, it splits
    the cores the process started with among the new local size."""
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if "OMP_NUM_THREADS" in os.environ:  # the user's choice, which torch has already read
        return torch.device("cpu")
    if not hasattr(pick_device, "start"):
        pick_device.start = (ordered_cores(os.sched_getaffinity(0)), launcher_bound())
    cores, bound = pick_device.start
    threads = len(cores)
    if not bound:  # else a launcher's binding is used as it is
        cores, threads = core_share(cores, local_rank, local_size)
        pin_process(cores)
    torch.set_num_threads(threads)
    return torch.device("cpu")


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


def build_model(args, device):
    torch.manual_seed(args.seed)  # the same initial weights for the same --seed
    model = models.get_model(args.arch, num_classes=len(data.CLASSES)).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    return model


def replace_batchnorm(module, factory):
    """Swap every BatchNorm2d for factory(num_features, ...), keeping its state."""
    for name, child in module.named_children():
        if isinstance(child, torch.nn.BatchNorm2d):
            new = factory(child.num_features, eps=child.eps, momentum=child.momentum,
                          affine=child.affine, track_running_stats=child.track_running_stats)
            new.load_state_dict(child.state_dict())
            setattr(module, name, new.to(next(child.buffers()).device))
        else:
            replace_batchnorm(child, factory)
    return module


def make_optimizer(model):
    # The LR is set by LRSchedule before every step; 0 here is a placeholder.
    return torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.9, weight_decay=5e-4)


def make_scaler(args, device, state=None):
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp and args.amp_dtype == "float16")
    if state and scaler.is_enabled():
        scaler.load_state_dict(state)
    return scaler


def compile_model(args, model):
    """What the loop calls: torch.compile'd under --compile. Save `model` itself."""
    return torch.compile(model) if args.compile else model


class LRSchedule:
    """Cosine from base_lr at start_epoch to 0 at epochs, stepped per epoch as in
    pytorch-cifar, times `scale` (the world size under Horovod), with an optional
    per-batch linear warm-up from base_lr to base_lr * scale (Goyal et al.).

    It is a pure function of the (fractional) epoch; its state is just where
    the cosine started and from what, which is all a resume needs.
    """

    def __init__(self, base_lr, start_epoch, epochs, scale=1.0, warmup_epochs=0.0):
        self.base_lr, self.start_epoch, self.epochs = base_lr, start_epoch, epochs
        self.scale, self.warmup_epochs = scale, warmup_epochs

    def state_dict(self):
        return {"base_lr": self.base_lr, "start_epoch": self.start_epoch}

    def __call__(self, epoch):
        span = max(self.epochs - self.start_epoch, 1)
        cosine = 0.5 * (1 + math.cos(math.pi * (math.floor(epoch) - self.start_epoch) / span))
        lr = self.base_lr * self.scale * cosine
        if epoch < self.warmup_epochs and self.scale != 1:
            lr *= (epoch * (self.scale - 1) / self.warmup_epochs + 1) / self.scale
        return lr

    def apply(self, optimizer, epoch):
        lr = self(epoch)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr


# ============================================================================
# Data loaders

def make_loaders(args, train, test, device, rank=0, size=1):
    per_step = args.batch_size * getattr(args, "batches_per_allreduce", 1)
    if args.loader == "torchvision":
        return (data.torchvision_loader(*train, per_step, train=True, rank=rank, size=size,
                                        seed=args.seed, workers=args.workers),
                data.torchvision_loader(*test, args.batch_size, train=False, rank=rank, size=size,
                                        workers=args.workers))
    dtype = torch.bfloat16 if args.amp and args.amp_dtype == "bfloat16" else torch.float32
    common = dict(rank=rank, size=size, seed=args.seed, device=device, dtype=dtype,
                  channels_last=device.type == "cuda")
    return (data.DeviceLoader(*train, per_step, train=True, **common),
            data.DeviceLoader(*test, args.batch_size, train=False, **common))


# ============================================================================
# The epoch loop

def seed_epoch(seed, epoch, rank):
    """Seed torch's global RNG (dropout, drop-connect) from (seed, epoch, rank), so a
    resumed run draws what the uninterrupted one would have."""
    torch.manual_seed(data.hash_seed(seed, epoch, rank))


def _autocast(args, device):
    if not args.amp:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, args.amp_dtype))


def optimizer_step(optimizer, scaler, profiler=None, adasum=False):
    """scaler.step(optimizer). A DistributedOptimizer first finishes its
    allreduce (timed under --profile-steps), so the scaler unscales and checks
    the averaged gradients; then the step skips the synchronize it would redo.
    Horovod's Adasum optimizer reduces inside step() and cannot be split."""
    profiler = profiler or PhaseTimer(0)
    if hasattr(optimizer, "synchronize") and not adasum:
        with profiler.phase("allreduce-wait"):
            optimizer.synchronize()
        with profiler.phase("optimizer-step"), optimizer.skip_synchronize():
            scaler.unscale_(optimizer)
            scaler.step(optimizer)
    else:
        with profiler.phase("optimizer-step"):
            scaler.step(optimizer)
    scaler.update()


class PhaseTimer:
    """--profile-steps: wall time of each phase of the first `steps` steps.

    Each phase is bracketed by device synchronisations, so the numbers are
    real but the run is slower while it measures; it is off by default.
    """
    PHASES = ("forward", "backward", "allreduce-wait", "optimizer-step")

    def __init__(self, steps, device=None):
        self.steps, self.device = steps, device
        self.times = {p: [] for p in self.PHASES}
        self.active = False

    def start_step(self, step):
        self.active = step < self.steps
        if self.active:
            for v in self.times.values():
                v.append(0.0)

    @contextlib.contextmanager
    def phase(self, name):
        if not self.active:
            yield
            return
        self._sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.times[name][-1] += time.perf_counter() - t0

    def _sync(self):
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def summary(self):
        def median(v):
            return sorted(v)[len(v) // 2] if v else 0.0
        parts = "  ".join(f"{p} {median(self.times[p]) * 1e3:.2f}" for p in self.PHASES)
        return f"profile: median ms per step over {len(self.times['forward'])} steps: {parts}"


def local_sum(t):
    """The single-process stand-in for a sum-allreduce."""
    return t


class Progress:
    """tqdm bars on rank 0 when stderr is a terminal. Without one (CI, pytest,
    mpirun and horovodrun pipes) a redrawn bar would be a flood of carriage
    returns, so each log interval prints one plain line instead."""

    def __init__(self, enabled):
        self.enabled = enabled
        self.tty = sys.stderr.isatty()

    def bar(self, total, desc):
        from tqdm import tqdm
        return tqdm(total=total, desc=desc, disable=not (self.enabled and self.tty), leave=False,
                    dynamic_ncols=True, file=sys.stderr)

    def interval(self, bar, desc, step, total, **values):
        """Show metrics reduced at a log interval."""
        text = {k: f"{v:.4g}" for k, v in values.items()}
        if self.tty:
            bar.set_postfix(text)
        elif self.enabled:
            print(f"{desc} [{step}/{total}] " + " ".join(f"{k} {v}" for k, v in text.items()), flush=True)

    def write(self, line):
        if self.enabled:
            print(line, flush=True)


def train_epoch(model, loader, optimizer, scaler, schedule, epoch, args, progress,
                allreduce=local_sum, profile_epoch=None):
    """One pass over this rank's shard. Returns global (loss, acc, images) and the last LR.

    Loss sum, correct count and image count stay on the device as one float64
    vector; they are reduced only every --log-interval steps and at the end,
    so the step loop never waits for the device or the other ranks.
    """
    model.train()
    device = next(model.parameters()).device  # the torchvision loader yields CPU tensors
    stats = torch.zeros(3, dtype=torch.float64, device=device)
    steps = len(loader)
    lr = schedule(epoch)
    desc = f"epoch {epoch + 1}"
    bar = progress.bar(steps, desc)
    # Only the first epoch of a run is profiled.
    profiler = PhaseTimer(args.profile_steps if epoch == profile_epoch else 0, device)
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        profiler.start_step(step)
        lr = schedule.apply(optimizer, epoch + step / steps)
        optimizer.zero_grad()
        parts = list(zip(x.split(args.batch_size), y.split(args.batch_size)))
        for xs, ys in parts:  # more than one under --batches-per-allreduce
            with profiler.phase("forward"), _autocast(args, device):
                out = model(xs)
                loss = F.cross_entropy(out, ys)
            with profiler.phase("backward"):
                scaler.scale(loss / len(parts)).backward()
            stats[0] += loss.detach().double() * len(ys)
            stats[1] += (out.detach().argmax(1) == ys).sum()
            stats[2] += len(ys)
        optimizer_step(optimizer, scaler, profiler, adasum=getattr(args, "use_adasum", False))
        if step + 1 == profiler.steps:
            progress.write(profiler.summary())
        bar.update(1)
        if (step + 1) % args.log_interval == 0 and step + 1 < steps:
            loss_sum, correct, n = allreduce(stats).tolist()
            progress.interval(bar, desc, step + 1, steps, loss=loss_sum / n, acc=correct / n, lr=lr)
    bar.close()
    loss_sum, correct, n = allreduce(stats).tolist()
    return {"loss": loss_sum / max(n, 1), "acc": correct / max(n, 1), "images": int(n), "lr": lr}


@torch.no_grad()
def evaluate(model, loader, args, progress, allreduce=local_sum):
    """Exact test metrics: each rank sums over its disjoint shard, one reduction at the end."""
    model.eval()
    device = next(model.parameters()).device
    stats = torch.zeros(3, dtype=torch.float64, device=device)
    bar = progress.bar(len(loader), "test")
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with _autocast(args, device):
            out = model(x)
        loss = F.cross_entropy(out.float(), y, reduction="sum")
        stats[0] += loss.double()
        stats[1] += (out.argmax(1) == y).sum()
        stats[2] += len(y)
        bar.update(1)
    bar.close()
    loss_sum, correct, n = allreduce(stats).tolist()
    return {"loss": loss_sum / max(n, 1), "acc": correct / max(n, 1), "images": int(n)}


# ============================================================================
# Checkpoints

def unwrap(model):
    """The plain module under torch.compile, so saved keys have no `_orig_mod.`."""
    return getattr(model, "_orig_mod", model)


def atomic_write(path, write):
    """Call write(file) on a temporary file beside path, fsync it, then rename it
    over path. A crash or a full disk leaves the old file as it was."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        cause = e
        while cause is not None and not isinstance(cause, OSError):  # torch.save wraps it
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            raise TrainerError(f"could not write {path} ({cause.strerror or cause}); the previous file "
                               "is unchanged: free space or fix permissions, then --resume") from e
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def save_checkpoint(path, state):
    atomic_write(path, lambda f: torch.save(state, f))


def load_checkpoint(path):
    """Load a checkpoint without running pickled code (weights_only=True)."""
    if not os.path.isfile(path):
        raise TrainerError(f"no checkpoint at {path}: train first, or point --checkpoint "
                           "(or --checkpoint-dir) at one")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0]
        if "unsupported global" in str(e).lower():  # a callable or class, not plain data
            raise TrainerError(f"refusing to load {path}: it contains pickled code or objects, "
                               "not just tensors and plain values; re-save it as a plain state_dict") from e
        raise TrainerError(f"checkpoint {path} is truncated or corrupt ({msg}); "
                           "use best.pth or an older copy, or start fresh with --overwrite") from e


def as_trainer_checkpoint(ckpt, path):
    """Our format as is; pytorch-cifar's {'net', 'acc', 'epoch'} mapped onto it."""
    if not isinstance(ckpt, dict):
        raise TrainerError(f"{path} is not a checkpoint dict")
    if "model" in ckpt and "epoch" in ckpt:
        return ckpt
    if "net" in ckpt:
        # pytorch-cifar saves the epoch it just finished, as a 0-based index, and
        # accuracy in percent; DataParallel adds a `module.` prefix to every key.
        state = {k[len("module."):] if k.startswith("module.") else k: v for k, v in ckpt["net"].items()}
        return {"model": state, "epoch": int(ckpt.get("epoch", -1)) + 1,
                "best_acc": float(ckpt.get("acc", 0.0)) / 100, "imported": True}
    raise TrainerError(f"{path} is neither this trainer's checkpoint nor pytorch-cifar's "
                       "(no 'model' or 'net' key)")


def load_model_state(model, state, path, arch_hint):
    target = unwrap(model)
    mine = target.state_dict()
    missing = [k for k in mine if k not in state]
    unexpected = [k for k in state if k not in mine]
    if missing or unexpected:
        raise TrainerError(f"checkpoint {path} does not fit --arch {arch_hint} ({len(missing)} missing and "
                           f"{len(unexpected)} unexpected keys, e.g. {(missing + unexpected)[0]}); "
                           "pass the --arch it was trained with")
    for k, v in state.items():
        if mine[k].shape != v.shape:
            raise TrainerError(f"checkpoint {path} does not fit --arch {arch_hint}: {k} has shape "
                               f"{tuple(v.shape)}, expected {tuple(mine[k].shape)} "
                               f"(another class count or width?); pass the matching --arch")
    target.load_state_dict(state)


def fresh_start(args):
    """Where a run without a checkpoint starts."""
    return {"epoch": 0, "best_acc": 0.0, "schedule": {"base_lr": args.lr or 0.1, "start_epoch": 0},
            "history": [], "optimizer_state": False, "scaler": None}


def restore(args, model, optimizer):
    """Load the checkpoint into model and optimizer; return where to start.

    A fresh run starts at epoch 0. `optimizer_state` says whether the optimizer
    now holds state, which the Horovod port needs to know before broadcasting it.
    """
    if not (args.resume or args.evaluate):
        return fresh_start(args)
    path = checkpoint_path(args)
    ckpt = as_trainer_checkpoint(load_checkpoint(path), path)
    if ckpt.get("arch", args.arch) != args.arch:
        raise TrainerError(f"checkpoint {path} is for --arch {ckpt['arch']}, not {args.arch}; "
                           f"pass --arch {ckpt['arch']}")
    load_model_state(model, ckpt["model"], path, args.arch)
    start = {"epoch": ckpt["epoch"], "best_acc": ckpt.get("best_acc", 0.0),
             "schedule": ckpt.get("scheduler") or {"base_lr": args.lr or 0.1, "start_epoch": 0},
             "history": [r for r in ckpt.get("history", []) if r["epoch"] <= ckpt["epoch"]],
             "optimizer_state": False, "scaler": ckpt.get("scaler")}
    if ckpt.get("optimizer"):
        optimizer.load_state_dict(ckpt["optimizer"])
        start["optimizer_state"] = True
    if args.resume and args.lr is not None:
        # --resume --lr X: a new cosine from X over the epochs that are left.
        start["schedule"] = {"base_lr": args.lr, "start_epoch": ckpt["epoch"]}
    if args.resume and ckpt["epoch"] >= args.epochs:
        raise UsageError(f"checkpoint {path} has already finished {ckpt['epoch']} of --epochs {args.epochs}; "
                         "pass a larger --epochs to train on")
    return start


def preflight(args, writer):
    """Fail before any work on what would fail later. Creates nothing.

    Only the process that reads and writes checkpoints (rank 0) checks them: on
    several hosts the others may not even see the folder.
    """
    if not writer:
        return
    if (args.resume or args.evaluate) and not os.path.isfile(checkpoint_path(args)):
        raise TrainerError(f"no checkpoint at {checkpoint_path(args)}: train without --resume first, "
                           "or point --checkpoint (or --checkpoint-dir) at one")
    if args.evaluate:
        return
    d = os.path.abspath(args.checkpoint_dir)
    parent = d
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise TrainerError(f"cannot write to --checkpoint-dir {args.checkpoint_dir} ({parent} is not a "
                           "writable folder); fix its permissions or choose another folder")
    existing = os.path.join(d, "ckpt.pth")
    if not args.resume and not args.overwrite and os.path.exists(existing):
        raise UsageError(f"{existing} already exists; pass --resume to continue it, --overwrite to "
                         "replace it, or another --checkpoint-dir")


# ============================================================================
# Reporting: console, metrics.csv, TensorBoard, curves.png, checkpoints

class RunLog:
    """Everything a run leaves behind. Only the process with enabled=True writes."""

    def __init__(self, args, enabled, world_size, history, purge_step=None):
        self.args, self.enabled, self.world_size = args, enabled, world_size
        self.history = list(history)
        self.dir = args.checkpoint_dir
        self.writer = None
        if enabled:
            try:
                os.makedirs(self.dir, exist_ok=True)
            except OSError as e:
                raise TrainerError(f"cannot create --checkpoint-dir {self.dir} ({e.strerror or e}); "
                                   "choose another folder") from e
            from torch.utils.tensorboard import SummaryWriter  # lazy: heavy import
            self.writer = SummaryWriter(os.path.join(self.dir, "tb"), purge_step=purge_step)

    def epoch_end(self, epoch, train, test, seconds, state, is_best):
        row = {"epoch": epoch + 1, "lr": train["lr"], "train_loss": train["loss"], "train_acc": train["acc"],
               "test_loss": test["loss"], "test_acc": test["acc"], "epoch_time_s": seconds,
               "images_per_s": train["images"] / max(seconds, 1e-9), "world_size": self.world_size}
        self.history.append(row)
        if not self.enabled:
            return
        print(f"epoch {epoch + 1}/{self.args.epochs}  lr {row['lr']:.4g}  "
              f"train loss {row['train_loss']:.4f} acc {row['train_acc']:.4f}  "
              f"test loss {row['test_loss']:.4f} acc {row['test_acc']:.4f}  "
              f"{seconds:.1f}s {row['images_per_s']:.0f} img/s  world {self.world_size}", flush=True)
        state = dict(state, history=self.history)
        # The checkpoint first, then metrics.csv from the same history: a crash in
        # between loses no row, and a resume rewrites the file from the checkpoint.
        save_checkpoint(os.path.join(self.dir, "ckpt.pth"), state)
        if is_best:
            save_checkpoint(os.path.join(self.dir, "best.pth"), state)
        self.write_csv()
        for k in ("lr", "train_loss", "train_acc", "test_loss", "test_acc", "images_per_s"):
            self.writer.add_scalar(k, row[k], epoch + 1)
        self.writer.flush()

    def write_csv(self):
        def write(f):
            import io
            text = io.StringIO()
            w = csv.DictWriter(text, fieldnames=METRICS_COLUMNS, lineterminator="\n")
            w.writeheader()
            w.writerows({k: r[k] for k in METRICS_COLUMNS} for r in self.history)
            f.write(text.getvalue().encode())
        atomic_write(os.path.join(self.dir, "metrics.csv"), write)

    def close(self):
        if not self.enabled:
            return
        self.writer.close()
        if self.history:
            plot_curves(self.history, os.path.join(self.dir, "curves.png"))


def plot_curves(history, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ep = [r["epoch"] for r in history]
    fig, ax = plt.subplots(2, 2, figsize=(10, 7))
    ax[0, 0].plot(ep, [r["train_loss"] for r in history], label="train")
    ax[0, 0].plot(ep, [r["test_loss"] for r in history], label="test")
    ax[0, 0].set_title("loss")
    ax[0, 1].plot(ep, [r["train_acc"] for r in history], label="train")
    ax[0, 1].plot(ep, [r["test_acc"] for r in history], label="test")
    ax[0, 1].set_title("accuracy")
    ax[1, 0].plot(ep, [r["lr"] for r in history])
    ax[1, 0].set_title("learning rate")
    ax[1, 1].plot(ep, [r["images_per_s"] for r in history])
    ax[1, 1].set_title("training images/s")
    for a in ax.flat:
        a.set_xlabel("epoch")
        a.grid(alpha=0.3)
    ax[0, 0].legend()
    ax[0, 1].legend()
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=80))
    plt.close(fig)


def checkpoint_state(args, model, optimizer, scaler, schedule, next_epoch, best_acc, world_size):
    return {"format": CHECKPOINT_FORMAT, "model": unwrap(model).state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": schedule.state_dict(), "scaler": scaler.state_dict(), "epoch": next_epoch,
            "best_acc": best_acc, "arch": args.arch, "num_classes": len(data.CLASSES),
            "world_size": world_size, "args": dict(vars(args))}


def evaluation_line(test):
    """The last line of --evaluate, for scripts: accuracy as a fraction."""
    return f"test_loss={test['loss']:.6f} test_acc={test['acc']:.6f} images={test['images']}"
