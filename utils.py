"""The training engine every trainer shares: model, optimizer, the LR schedule it runs
(training/run/schedule.py), loaders, one epoch of training, and exact evaluation.

The entry points (main.py and its ports) call these functions in the same order.
What a port differs in reaches the engine as one value, a `World`: this process's rank
and the world size, the allreduce of the metric sums, DDP's `no_sync`, the LR scale and
the backward passes per allreduce. Nothing here imports Horovod or torch.distributed.
One function knows of Horovod's DistributedOptimizer by its methods:
`optimizer_step` calls its synchronize() before the step when it has one.
"""
import contextlib
import copy
import dataclasses
import time
from typing import Callable

import torch
import torch.nn.functional as F

import models
from training.base import layout, recipe
from training.ports import eager_sgd
from training.run import data, divergence, loaders
from training.run.phases import PhaseTimer
from training.run.runlog import Progress, first_reaching
from training.run.schedule import LRSchedule


def local_sum(t):
    """The single-process stand-in for a sum-allreduce."""
    return t


@dataclasses.dataclass(frozen=True, kw_only=True)
class World:
    """The processes this one trains with, as the engine sees them; `World()` is main.py's
    single process. What a port differs in, as one value.

    allreduce(t) returns the sum of t over all ranks (a new tensor; t stays this
    rank's own). lr_scale multiplies the base LR (linear scaling). no_sync: the
    trained model is DDP's, whose no_sync() holds back the gradient reduction of a
    step's first k - 1 backward passes. adasum: Horovod's Adasum optimizer, which
    reduces inside step(). grad_path: how the gradients reach Horovod's allreduce (hooks, one
    or regions: training/ports/hvd_port.py); under regions --compile compiles the model block
    by block."""
    rank: int = 0
    size: int = 1
    allreduce: Callable = local_sum
    lr_scale: float = 1.0
    batches_per_allreduce: int = 1
    no_sync: bool = False
    adasum: bool = False
    grad_path: str = "hooks"

    @classmethod
    def of(cls, args, *, size, lr_size=None, **fields):
        """A port's world of `size` processes, as the flags set it: the LR x lr_size (by
        default the size: linear scaling for gradients averaged over the ranks) x the backward
        passes per step, and Adasum or not."""
        lr_size = size if lr_size is None else lr_size
        return cls(size=size, lr_scale=args.batches_per_allreduce * lr_size, adasum=args.use_adasum,
                   batches_per_allreduce=args.batches_per_allreduce, **fields)

    @property
    def is_rank0(self):
        """Whether this rank reports: prints, and writes the run's files (rank 0)."""
        return self.rank == 0


# ============================================================================
# Model, optimizer, scaler

def build_model(args, device):
    """The model, contiguous: `training_model` gives it its training layout later, after
    the ports' broadcasts (layout.py says why)."""
    torch.manual_seed(args.seed)  # the same initial weights for the same --seed
    return models.get_model(args.arch, num_classes=len(data.CLASSES)).to(device)


def make_optimizer(model, args):
    """SGD with the chosen recipe's momentum, --weight-decay, Nesterov under --nesterov. The LR
    is set by LRSchedule before every step; 0 here is a placeholder. Fused: the whole update is
    one kernel per step instead of a few per tensor group. Without --compile, torch's SGD
    without the import of torch's compiler that it makes only to be traced (eager_sgd.py)."""
    make = torch.optim.SGD if args.compile else eager_sgd.sgd
    return make(model.parameters(), lr=0.0, momentum=recipe.chosen(args)["momentum"],
                nesterov=args.nesterov, weight_decay=args.weight_decay, fused=True)


def make_scaler(args, device, state=None):
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp and args.amp_dtype == "float16")
    if state and scaler.is_enabled():
        scaler.load_state_dict(state)
    return scaler


def compile_mode(args, device):
    """torch.compile's mode for --compile: on CUDA, reduce-overhead unless another is named. A
    ResNet-18 step at batch 128 takes less GPU time than its kernel launches take to issue, and
    CUDA graphs issue them all at once (docs/PERFORMANCE.md has the measured gain).

    Under --batches-per-allreduce > 1 the default is a mode without CUDA graphs: gradients
    accumulated over several replays of a captured backward have open upstream reports of
    outputs overwritten and wrong sums (pytorch#96693, pytorch#169545). cli.py refuses the
    CUDA-graph modes by name with k > 1 for the same reason."""
    if args.compile != "auto":
        return args.compile
    if device.type != "cuda":
        return "default"
    accumulates = args.batches_per_allreduce > 1
    return "max-autotune-no-cudagraphs" if accumulates else "reduce-overhead"


def training_model(args, model, optimizer, world=World(), wrap=None):
    """What the loop calls: `model` with its weights and momentum in channels_last under
    --channels-last, wrapped by `wrap` if given (DDP's port), and torch.compile'd under
    --compile, as a whole or, where `world.grad_path` is regions, block by block
    (compiled_regions). Save `model` itself.

    The wrapper is compiled, not wrapped around the compiled model: Dynamo then splits DDP's
    graph at its buckets (DDPOptimizer), so each bucket's allreduce starts while the rest of
    the backward computes; around a compiled model, every bucket would be ready only when the
    whole compiled backward has ended. Horovod's gradient hooks and the optimizer step stay
    eager, outside any captured graph, and so does an epoch's last, smaller batch
    (FullBatchesCompiled)."""
    device = next(model.parameters()).device
    if layout.use_channels_last(args, device):
        layout.channels_last(model, optimizer)
    if wrap is not None:
        model = wrap(model)
    if not args.compile:
        return model
    mode = compile_mode(args, device)
    if world.grad_path == "regions":
        compiled = compiled_regions(model, mode)
    else:
        compiled = torch.compile(model, mode=mode, dynamic=False)
    return FullBatchesCompiled(model, compiled, args.batch_size)


CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


def _has_parameters(module):
    return module is not None and next(module.parameters(), None) is not None


def regions(model, prefix=""):
    """(name, module) of each part compiled_regions compiles: the model's children that hold
    parameters, a container's (Sequential, ModuleList, ModuleDict) own children in its place.
    ResNet-18: conv1, bn1, the eight blocks layer1.0 to layer4.1, and linear."""
    for name, child in model.named_children():
        if _has_parameters(child):
            if isinstance(child, CONTAINERS):
                yield from regions(child, f"{prefix}{name}.")
            else:
                yield f"{prefix}{name}", child


def compiled_regions(model, mode):
    """A twin of `model` (the same parameters and buffers) whose `regions` each run as a compiled
    graph of their own; what the model's own forward does between them runs eagerly. A
    compiled graph's backward is one node to autograd, which accumulates its parameters'
    gradients when that node ends: a region's gradients then reach Horovod's hooks while the
    regions before it still run backward, where a model compiled whole hands over every
    gradient at its very end. Blocks, not whole stages: ResNet-18's last stage holds 34 of its
    45 MB of gradients, which would wait for that whole stage's backward.

    Regions of one class share their forward's code, and Dynamo keeps a code's graphs in one
    cache of at most `recompile_limit` (8) before it runs the rest eagerly: ResNet-18's blocks
    need 7 there, and a model with more shapes of one region class needs more. The limit is
    raised to the number of regions."""
    import torch._dynamo
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = max(limit, len(list(regions(model))))

    def twin(module):
        copied = copy.copy(module)
        copied.__dict__["_modules"] = {
            name: child if not _has_parameters(child)
            else twin(child) if isinstance(child, CONTAINERS)
            else torch.compile(child, mode=mode, dynamic=False)
            for name, child in module._modules.items()}
        return copied
    return twin(model)


class FullBatchesCompiled(torch.nn.Module):
    """--compile: batches of --batch-size images run compiled, with static shapes; any other
    (an epoch's last, smaller one) runs the model itself. Compiled graphs then exist for the
    one batch size in training and in evaluation, each compiled once: a smaller batch would
    cost a compilation of its own, or with dynamic shapes a recompilation of every batch's
    graph with a symbolic batch size. Both paths share the one set of weights."""

    def __init__(self, model, compiled, batch_size):
        super().__init__()
        self.model, self.compiled, self.batch_size = model, compiled, batch_size

    def forward(self, x):
        return (self.compiled if len(x) == self.batch_size else self.model)(x)

    def no_sync(self):
        """DDP's no_sync() of the wrapped model (--batches-per-allreduce under DDP): it holds
        back the reduction of both paths' backward passes, which share the one wrapper."""
        return self.model.no_sync()

    @property
    def _orig_mod(self):
        """The model, as torch.compile's module names it (checkpoints.unwrap reads it)."""
        return self.model


def make_schedule(args, saved, scale=1.0):
    """The run's LRSchedule (training/run/schedule.py): `saved` (where it starts, from what LR:
    checkpoints' start), the flags' shape, epochs and warm-up, the recipe's one-cycle peak, the
    port's LR scale."""
    return LRSchedule(**saved, epochs=args.epochs, scale=scale, warmup_epochs=args.warmup_epochs,
                      shape=args.lr_schedule, peak=recipe.chosen(args)["onecycle_peak"])


# ============================================================================
# Data loaders

def make_loaders(args, train, test, device, world=World()):
    """This rank's (train, test) loaders. A training batch holds the images of all
    of a step's backward passes (--batches-per-allreduce)."""
    per_step, rank, size = args.batch_size * world.batches_per_allreduce, world.rank, world.size
    pad = recipe.chosen(args)["crop_padding"]
    if args.loader == "torchvision":
        return (loaders.torchvision_loader(*train, per_step, train=True, rank=rank, size=size,
                                           seed=args.seed, workers=args.workers, pad=pad),
                loaders.torchvision_loader(*test, args.batch_size, train=False, rank=rank,
                                           size=size, workers=args.workers))
    dtype = torch.bfloat16 if args.amp and args.amp_dtype == "bfloat16" else torch.float32
    common = dict(rank=rank, size=size, seed=args.seed, device=device, dtype=dtype,
                  channels_last=layout.use_channels_last(args, device), pad=pad)
    return (loaders.DeviceLoader(*train, per_step, train=True, cutout=args.cutout, **common),
            loaders.DeviceLoader(*test, args.batch_size, train=False, **common))


# ============================================================================
# The epoch loop

def target_reached(args, history):
    """Whether an epoch so far (resumed ones too) reached --target-acc: the loop ends there."""
    return first_reaching(history, args.target_acc) is not None


def seed_epoch(seed, epoch, rank):
    """Seed torch's global RNG (dropout, drop-connect) from (seed, epoch, rank), so a
    resumed run draws what the uninterrupted one would have."""
    torch.manual_seed(loaders.hash_seed(seed, epoch, rank))


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


def train_and_test(train_model, model, train_loader, test_loader, optimizer, scaler, schedule,
                   epoch, args, world=World(), profile=False):
    """One epoch as every trainer runs it: (train metrics, test metrics, seconds of training).
    The training, then the ranks' BatchNorm statistics averaged (what is evaluated is what is
    saved), the test, and the divergence guard, which runs before the caller saves anything.
    `model` is the plain module under `train_model` (the one whose buffers are saved)."""
    t0 = time.perf_counter()
    train = train_epoch(train_model, train_loader, optimizer, scaler, schedule, epoch, args, world,
                        profile=profile)
    seconds = time.perf_counter() - t0
    average_batchnorm(model, world)
    test = evaluate(train_model, test_loader, args, world)
    divergence.check_epoch(model, train, test, epoch, world)
    return train, test, seconds


def train_epoch(model, loader, optimizer, scaler, schedule, epoch, args, world=World(),
                profile=False):
    """One pass over this rank's shard. Returns global (loss, acc, images) and the last LR.

    Under --batches-per-allreduce k with `world.no_sync`, DDP's model.no_sync() wraps
    the first k - 1 backward passes, so that gradients accumulate locally and are
    averaged once. `profile`: time the first --profile-steps steps (the first epoch of a run).

    Loss sum, correct count and image count stay on the device as one float64
    vector; they are reduced only every --log-interval steps and at the end,
    so the step loop never waits for the device or the other ranks.
    """
    loader.set_epoch(epoch)
    seed_epoch(args.seed, epoch, world.rank)
    model.train()
    device = next(model.parameters()).device  # the torchvision loader yields CPU tensors
    fmt = layout.memory_format(args, device)
    stats = torch.zeros(3, dtype=torch.float64, device=device)
    steps = len(loader)
    lr = schedule(epoch)
    desc = f"epoch {epoch + 1}"
    progress = Progress(world.is_rank0)
    bar = progress.bar(steps, desc)
    # --profile-steps beyond the epoch's length profiles the whole epoch.
    profiler = PhaseTimer(min(args.profile_steps, steps) if profile else 0, device)
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device, non_blocking=True, memory_format=fmt), y.to(device, non_blocking=True)
        profiler.start_step(step)
        lr = schedule.apply(optimizer, epoch + step / steps)
        optimizer.zero_grad()
        parts = list(zip(x.split(args.batch_size), y.split(args.batch_size)))
        for i, (xs, ys) in enumerate(parts):  # more than one under --batches-per-allreduce
            hold = world.no_sync and i + 1 < len(parts)
            with model.no_sync() if hold else contextlib.nullcontext():
                with profiler.phase("forward"), _autocast(args, device):
                    out = model(xs)
                    loss = F.cross_entropy(out, ys, label_smoothing=args.label_smoothing)
                with profiler.phase("backward"):
                    scaler.scale(loss / len(parts)).backward()
            stats[0] += loss.detach().double() * len(ys)
            stats[1] += (out.detach().argmax(1) == ys).sum()
            stats[2] += len(ys)
        optimizer_step(optimizer, scaler, profiler, adasum=world.adasum)
        if step + 1 == profiler.steps:
            progress.write(profiler.summary())
        bar.update(1)
        if (step + 1) % args.log_interval == 0 and step + 1 < steps:
            loss_sum, correct, n = world.allreduce(stats).tolist()
            divergence.check_training_loss(loss_sum / n, epoch, lr, step + 1, steps)
            progress.interval(bar, desc, step + 1, steps, loss=loss_sum / n, acc=correct / n, lr=lr)
    bar.close()
    loss_sum, correct, n = world.allreduce(stats).tolist()
    divergence.check_training_loss(loss_sum / max(n, 1), epoch, lr, steps, steps)
    return {"loss": loss_sum / max(n, 1), "acc": correct / max(n, 1), "images": int(n), "lr": lr}


@torch.no_grad()
def average_batchnorm(model, world=World()):
    """Every rank's BatchNorm running statistics replaced by their mean over the ranks, in one
    reduction: the loop's step before each evaluation, so that the ranks evaluate the one
    model that the checkpoint saves. Each rank updates its own statistics from its own
    batches (neither Horovod nor the DDP port syncs them); the mean (timm's distribute_bn
    convention) estimates from all ranks' batches, where rank 0's would use a 1/size share.
    Under --sync-bn the ranks' statistics are already equal, and their mean in float64 is
    each of them exactly. Nothing to do for one process."""
    stats = [b for name, b in model.named_buffers()
             if name.endswith(("running_mean", "running_var"))]
    if world.size == 1 or not stats:
        return
    flat = torch.cat([b.detach().double().flatten() for b in stats])
    mean = world.allreduce(flat) / world.size
    for b, part in zip(stats, mean.split([b.numel() for b in stats])):
        b.copy_(part.view_as(b))


def tta_logits(model, x):
    """--tta: the logits of x and of its mirror image, averaged; averaged again with the same
    of x shifted one pixel up-left and of x shifted one pixel down-right (edges reflected)."""
    def mirrored(v):
        return 0.5 * (model(v).float() + model(v.flip(-1)).float())
    h, w = x.shape[-2:]
    padded = F.pad(x, (1, 1, 1, 1), mode="reflect")
    shifted = 0.5 * (mirrored(padded[..., :h, :w]) + mirrored(padded[..., 2:, 2:]))
    return 0.5 * (mirrored(x) + shifted)


@torch.no_grad()
def evaluate(model, loader, args, world=World()):
    """Exact test metrics of the model as it is: each rank sums over its disjoint shard, one
    reduction at the end. Nothing of the model changes. Under --tta each image's logits are
    averaged over augmented views of it (tta_logits)."""
    model.eval()
    device = next(model.parameters()).device
    fmt = layout.memory_format(args, device)
    stats = torch.zeros(3, dtype=torch.float64, device=device)
    bar = Progress(world.is_rank0).bar(len(loader), "test")
    for x, y in loader:
        x, y = x.to(device, non_blocking=True, memory_format=fmt), y.to(device, non_blocking=True)
        with _autocast(args, device):
            out = tta_logits(model, x) if args.tta else model(x)
        loss = F.cross_entropy(out.float(), y, reduction="sum")
        stats[0] += loss.double()
        stats[1] += (out.argmax(1) == y).sum()
        stats[2] += len(y)
        bar.update(1)
    bar.close()
    loss_sum, correct, n = world.allreduce(stats).tolist()
    return {"loss": loss_sum / max(n, 1), "acc": correct / max(n, 1), "images": int(n)}
