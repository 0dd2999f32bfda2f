"""Checkpoints: what a run saves, every save of it, how it is read, and where a run starts.

A checkpoint is one dict holding everything needed to continue: the unwrapped
model, the optimizer, the LR schedule's state, the GradScaler, the next epoch,
the best accuracy and the metric history. `save` writes CHECKPOINT_DIR/ckpt.pth at
the end of every epoch and best.pth at a new best test accuracy, each atomically
(safeio.atomic_write); it is read with `torch.load(weights_only=True)`, which runs
no pickled code. pytorch-cifar's checkpoints are read too.

Nothing here talks to other processes: the Horovod ports call `restore` on rank 0 and
broadcast what it returns, the DDP port calls it on every rank. `restore` is two steps:
`read_start` reads and checks (every refusal a line of its own, and where `reports`, one line
saying what a --resume continues), `apply_start` loads what was read into the model and the
optimizer. The run folder is checked and held apart from these (rundir.py).
"""
import dataclasses
import os
import zipfile

import torch

from training.base import recipe, redact
from training.base.errors import TrainerError, UsageError
from training.base.layout import contiguous_state
from training.base.safeio import atomic_write
from training.run import cli, data

# 2: the LR schedule's state is saved under "schedule" (format 1 called it "scheduler").
FORMAT = 2
# in --checkpoint-dir: the last epoch's, the best test accuracy's
LAST, BEST = "ckpt.pth", "best.pth"
# What torch.load says of a file cut short or damaged (its zip reader's words, pickle's).
TRUNCATED = ("zip archive", "central directory", "Ran out of input", "invalid load key",
             "unexpected EOF", "truncated")


def checkpoint_path(args):
    """The file --resume and --evaluate read."""
    return args.checkpoint or os.path.join(args.checkpoint_dir, LAST)


def resuming(args):
    """Whether this run continues a checkpoint: --resume, or --auto-resume where one exists."""
    return args.resume or (args.auto_resume and os.path.isfile(checkpoint_path(args)))


def unwrap(model):
    """The plain module under DistributedDataParallel (`module.`) and torch.compile
    (`_orig_mod.`), so saved keys have neither prefix and load into any trainer."""
    while True:
        if type(model).__name__ in ("DistributedDataParallel", "DataParallel"):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def checkpoint_state(args, model, optimizer, scaler, schedule, next_epoch, best_acc, world_size,
                     history, tracking=None):
    """Everything a resume needs; tensors contiguous, so it loads alike under either layout.
    `tracking`: the run's tracker's state (the MLflow run it continues, tracking.py), or None."""
    return {"format": FORMAT, "model": contiguous_state(unwrap(model).state_dict()),
            "optimizer": contiguous_state(optimizer.state_dict()),
            "schedule": schedule.state_dict(), "scaler": scaler.state_dict(), "epoch": next_epoch,
            "best_acc": best_acc, "arch": args.arch, "num_classes": len(data.CLASSES),
            "world_size": world_size, "args": redact.flags(args), "history": list(history),
            "tracking": tracking}


def save(args, state, is_best, reports):
    """The end of an epoch, on the rank that reports: ckpt.pth, and best.pth when the epoch
    set a new best test accuracy. Other ranks write nothing."""
    if not reports:
        return
    save_checkpoint(os.path.join(args.checkpoint_dir, LAST), state)
    if is_best:
        save_checkpoint(os.path.join(args.checkpoint_dir, BEST), state)


def save_checkpoint(path, state):
    atomic_write(path, lambda f: torch.save(state, f))


def not_a_checkpoint(path):
    """True when the file is neither torch.save's zip archive nor its legacy format (a pickle
    of protocol 2, which starts with bytes 0x80 0x02): random bytes, or a file cut before its
    first record."""
    with open(path, "rb") as f:
        head = f.read(2)
    return not zipfile.is_zipfile(path) and head != b"\x80\x02"


def load_checkpoint(path):
    """Load a checkpoint without running pickled code (weights_only=True)."""
    if not os.path.isfile(path):
        raise TrainerError(f"no checkpoint at {path}: train first, or point --checkpoint "
                           "(or --checkpoint-dir) at one")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except OSError as e:  # the file could not be read at all: permissions, a folder, I/O
        raise TrainerError(f"cannot read checkpoint {path} ({e.strerror or e}); fix its "
                           "permissions, or point --checkpoint at a readable file") from e
    except Exception as e:
        text = str(e).strip()
        msg = (text.splitlines() or [type(e).__name__])[0].split(". ")[0]
        if "unsupported global" in text.lower():  # a callable or class, not plain data
            raise TrainerError(f"refusing to load {path}: it contains pickled code or objects, "
                               "not just tensors and plain values; "
                               "re-save it as a plain state_dict") from e
        if isinstance(e, EOFError) or any(s in text for s in TRUNCATED) or not_a_checkpoint(path):
            raise TrainerError(f"checkpoint {path} is truncated or corrupt ({msg}); use best.pth "
                               "or an older copy, or start fresh with --overwrite") from e
        raise TrainerError(f"PyTorch {torch.__version__} cannot read checkpoint {path} ({msg}); "
                           "a checkpoint from another PyTorch may need that version, else use "
                           "best.pth or an older copy") from e


def as_trainer_checkpoint(ckpt, path):
    """Our format as is; pytorch-cifar's {'net', 'acc', 'epoch'} mapped onto it."""
    if not isinstance(ckpt, dict):
        raise TrainerError(f"{path} is not a checkpoint dict")
    if "model" in ckpt and "epoch" in ckpt:
        return ckpt
    if "net" in ckpt:
        # pytorch-cifar saves the epoch it just finished, as a 0-based index, and
        # accuracy in percent; DataParallel adds a `module.` prefix to every key.
        state = {k[len("module."):] if k.startswith("module.") else k: v
                 for k, v in ckpt["net"].items()}
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
        raise TrainerError(f"checkpoint {path} does not fit --arch {arch_hint} "
                           f"({len(missing)} missing and "
                           f"{len(unexpected)} unexpected keys, e.g. {(missing + unexpected)[0]}); "
                           "pass the --arch it was trained with")
    for k, v in state.items():
        if mine[k].shape != v.shape:
            raise TrainerError(f"checkpoint {path} does not fit --arch {arch_hint}: {k} has shape "
                               f"{tuple(v.shape)}, expected {tuple(mine[k].shape)} "
                               f"(another class count or width?); pass the matching --arch")
    target.load_state_dict(state)


def first_schedule(args):
    """The schedule a run starts with: --lr, else the recipe's, from epoch 0."""
    return {"base_lr": args.lr or recipe.chosen(args)["lr"], "start_epoch": 0}


@dataclasses.dataclass
class Start:
    """Where a run starts (read from its checkpoint, or fresh): what the trainers read."""
    schedule: dict  # the LR schedule to follow (utils.make_schedule's state)
    epoch: int = 0  # the first epoch to train, counted from 0: the epochs done
    best_acc: float = 0.0  # the best test accuracy of the epochs done
    history: list = dataclasses.field(default_factory=list)  # their metrics rows
    optimizer_state: bool = False  # whether the optimizer now holds state (to broadcast)
    scaler: dict = None  # GradScaler's state, where it was enabled
    tracking: dict = None  # the MLflow run the run logged to (tracking.py)


def fresh_start(args):
    """Where a run without a checkpoint starts."""
    return Start(schedule=first_schedule(args))


def restore(args, model, optimizer, reports=True):
    """Where this run starts, read (`read_start`) and then applied to model and optimizer
    (`apply_start`); see both. The ports call it where they read the checkpoint: every rank
    under DDP, rank 0 under Horovod, which broadcasts what it returns."""
    return apply_start(*read_start(args, reports), model, optimizer, args.arch)


def read_start(args, reports=True):
    """Where this run starts, read and checked, nothing applied: a fresh run at epoch 0, else
    the checkpoint's next epoch, best accuracy, history, GradScaler state, the schedule to follow
    (the saved one, or a new one from --lr), its weights and, for a training run, its optimizer
    state. Every refusal is one line (TrainerError or UsageError) before anything is loaded: no
    or a damaged checkpoint, another --arch, non-finite weights, nothing left to train. The
    process that reports says in one line what a resume continues."""
    if not (resuming(args) or args.evaluate):
        return fresh_start(args), {"weights": None, "optimizer": None, "path": None}
    path = checkpoint_path(args)
    ckpt = read_checkpoint(args, path)
    start = saved_start(args, ckpt)
    read = {"weights": ckpt["model"], "optimizer": None, "path": path}
    if args.evaluate:
        return start, read  # the optimizer is not needed, so its state is neither loaded nor sent
    if already_ended(args, path, ckpt["epoch"]):
        if reports:
            print(f"{path} has finished epoch {ckpt['epoch']}: nothing left to train before "
                  f"epoch {cli.last_epoch(args)}", flush=True)
        return start, read
    read["optimizer"] = ckpt.get("optimizer") or None
    start.schedule, restarted = schedule_after(args, ckpt["epoch"], start.schedule)
    if reports:  # one process says what it resumed
        print(resume_line(path, start, args, restarted, ckpt.get("imported", False)), flush=True)
    return start, read


def apply_start(start, read, model, optimizer, arch):
    """Load what read_start read (`read`: the weights, the optimizer's state, the path) into
    model (checked against its keys and shapes: one line naming the --arch it needs) and
    optimizer. Returns the start, its `optimizer_state` saying whether the optimizer now holds
    state, which the Horovod port needs to know before broadcasting it. It writes nothing: a
    training run then holds its folder (hold_folder)."""
    if read["weights"] is not None:
        load_model_state(model, read["weights"], read["path"], arch)
    start.optimizer_state = load_optimizer_state(optimizer, read["optimizer"])
    return start


def saved_start(args, ckpt):
    """Where the checkpoint left off: its next epoch, best accuracy, schedule, history (up to
    that epoch), GradScaler state and the tracker's state."""
    return Start(epoch=ckpt["epoch"], best_acc=ckpt.get("best_acc", 0.0),
                 schedule=saved_schedule(args, ckpt),
                 history=[r for r in ckpt.get("history", []) if r["epoch"] <= ckpt["epoch"]],
                 scaler=ckpt.get("scaler"), tracking=ckpt.get("tracking"))


def read_checkpoint(args, path):
    """The checkpoint at path as this trainer's dict, refused in one line if it is for another
    --arch or holds non-finite weights (a diverged run's: resuming them trains nothing)."""
    ckpt = as_trainer_checkpoint(load_checkpoint(path), path)
    if ckpt.get("arch", args.arch) != args.arch:
        raise TrainerError(f"checkpoint {path} is for --arch {ckpt['arch']}, not {args.arch}; "
                           f"pass --arch {ckpt['arch']}")
    bad = [k for k, v in ckpt["model"].items() if torch.is_tensor(v) and v.is_floating_point()
           and not torch.isfinite(v).all()]
    if bad:
        raise TrainerError(f"checkpoint {path} holds non-finite weights ({bad[0]}), "
                           "as a diverged run leaves "
                           "them; resume from an earlier copy, or start anew with --overwrite")
    return ckpt


def saved_schedule(args, ckpt):
    """The LR schedule the checkpoint was trained on (pytorch-cifar's have none: the recipe's)."""
    schedule = ckpt.get("schedule") or ckpt.get("scheduler")  # format 1 said "scheduler"
    return schedule or first_schedule(args)


def already_ended(args, path, done):
    """Whether an --auto-resume restart finds its run already at its last epoch (nothing to
    train, and no error); otherwise a resume that would train nothing is a usage error."""
    last = cli.last_epoch(args)
    ended = done >= last and args.auto_resume
    if done >= args.epochs and not ended:
        raise UsageError(f"checkpoint {path} has already finished {done} "
                         f"of --epochs {args.epochs}; --epochs is the total, so pass a larger "
                         f"one to train on (--epochs {done + 50} trains 50 more)")
    if args.stop_at is not None and args.stop_at <= done and not ended:
        raise UsageError(f"--stop-at {args.stop_at} is not after the checkpoint's epoch {done}, "
                         "so nothing would be trained; pass a later --stop-at")
    return ended


def load_optimizer_state(optimizer, state):
    """The saved hyperparameters and momentum, but this optimizer's implementation (fused or
    foreach). Whether there was any state to load."""
    if not state:
        return False
    impl = [{k: g.get(k) for k in ("fused", "foreach")} for g in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for g, kept in zip(optimizer.param_groups, impl):
        g.update(kept)
    return True


def schedule_after(args, done, saved):
    """The schedule a resume after epoch `done` follows, and whether --lr restarted it.
    --resume --lr X: a new schedule from X over the epochs that are left. Under --auto-resume the
    same command starts the job and every restart, so --lr is the fresh start's and a restart
    continues the saved schedule, wherever it was stopped."""
    restarted = args.lr is not None and not args.auto_resume
    if restarted:
        return {"base_lr": args.lr, "start_epoch": done}, True
    return saved, False


def resume_line(path, start, args, restarted, imported=False):
    """One line naming what --resume continues: the file, its epoch and best accuracy,
    and whether the saved schedule (cosine or one-cycle) goes on or --lr restarted it, over how
    many epochs."""
    done, sched = start.epoch, start.schedule
    shape = "one-cycle" if args.lr_schedule == "onecycle" else "cosine"
    left = args.epochs - done
    span = f"epoch {args.epochs}" if left == 1 else f"the {left} epochs {done + 1}-{args.epochs}"
    if restarted:
        lr = f"--lr {args.lr:g} restarts the {shape} over {span}"
    else:
        lr = (f"the saved {shape} (lr {sched['base_lr']:g} from epoch {sched['start_epoch']}) "
              f"continues over {span}")
    origin = " (pytorch-cifar's: no optimizer state)" if imported else ""
    return (f"resuming {path}{origin} after epoch {done}, "
            f"best test acc {start.best_acc:.4f}; {lr}")
