"""The run folder (--checkpoint-dir): checked before a run does any work, and held by one run
at a time while it writes there.

`preflight` fails at once on what would fail later (no checkpoint to resume or evaluate, a
folder that cannot be written, a checkpoint a fresh run would replace). `hold` then makes the
folder the run's, with a lock the kernel drops with the process, before anything is written;
`hold_waiting` and `let_go` hold it across runs of one process (a search's trial).
Only the process that reports does either: on several hosts the others may not see the folder.
What is saved there, and how it is read, is checkpoints.py's.
"""
import os
import socket
import time

from training.base.errors import TrainerError, UsageError
from training.base.safeio import hold as hold_lock
from training.base.safeio import holder_of
from training.base.safeio import let_go as let_go_lock
from training.run import checkpoints

HOLDER = ".run.lock"  # in --checkpoint-dir: locked by the run that writes there


def preflight(args, reports):
    """Fail before any work on what would fail later. Creates nothing.

    Only the process that reads and writes checkpoints (the one that reports) checks
    them: on several hosts the others may not even see the folder.
    """
    if not reports:
        return
    if (args.resume or args.evaluate) and not os.path.isfile(checkpoints.checkpoint_path(args)):
        raise TrainerError(f"no checkpoint at {checkpoints.checkpoint_path(args)}: "
                           "train without --resume first, "
                           "or point --checkpoint (or --checkpoint-dir) at one")
    if args.evaluate:
        return
    d = os.path.abspath(args.checkpoint_dir)
    parent = d
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise TrainerError(f"cannot write to --checkpoint-dir {args.checkpoint_dir} "
                           f"({parent} is not a "
                           "writable folder); fix its permissions or choose another folder")
    refuse_replacing(args)


def refuse_replacing(args):
    """A fresh run does not replace a checkpoint unless told to. Where a running run holds
    the folder (and wrote that checkpoint), that is what the user is told."""
    existing = os.path.join(args.checkpoint_dir, checkpoints.LAST)
    if not checkpoints.resuming(args) and not args.overwrite and os.path.exists(existing):
        holder = holder_of(os.path.join(args.checkpoint_dir, HOLDER))
        if holder is not None:
            raise _in_use(args.checkpoint_dir, holder)
        raise UsageError(f"{existing} already exists; pass --resume to continue it, --overwrite to "
                         "replace it, or another --checkpoint-dir")


def hold(args, reports=True):
    """Make --checkpoint-dir this run's until the process ends, or stop with one line naming
    the run that holds it: two runs writing one folder would overwrite each other's
    checkpoints and metrics in turn. A lock file the kernel drops with its process,
    however it ends, so a restarted job takes the folder over once the old run is gone.
    Under the lock, a fresh run looks again for a checkpoint it must not replace (one that
    another run finished since preflight). Only the process that reports holds it."""
    if not reports:
        return
    folder = args.checkpoint_dir
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise TrainerError(f"cannot create --checkpoint-dir {folder} ({e.strerror or e}); "
                           "choose another folder") from e
    holder = hold_lock(os.path.join(folder, HOLDER), _this_process(),
                       hint="fix the permissions of --checkpoint-dir")
    if holder is not None:
        raise _in_use(folder, holder)
    refuse_replacing(args)


def hold_waiting(folder, waits):
    """Hold `folder` as a run does (hold), waiting while another process holds it, and calling
    waits(holder) once if it does: a process that trains runs in turn (a search's group, a
    trial at a time) takes a trial's folder only once the group that had it let go. Ended by
    let_go; the run's own hold then finds the folder held already."""
    os.makedirs(folder, exist_ok=True)
    said = False
    while (holder := hold_lock(os.path.join(folder, HOLDER), _this_process(),
                               hint="fix the permissions of --checkpoint-dir")) is not None:
        if not said:
            waits(holder or "a run starting")
            said = True
        time.sleep(1.0)


def let_go(folder):
    """Let go of a folder held by hold_waiting (or a run's hold), before the process ends."""
    let_go_lock(os.path.join(folder, HOLDER))


def _this_process():
    """What a holder writes into the lock file, for whoever finds the folder held."""
    return f"host {socket.gethostname()}, process {os.getpid()}"


def _in_use(folder, holder):
    return TrainerError(f"--checkpoint-dir {folder} is in use by another run "
                        f"({holder or 'starting'}); "
                        "wait for it to end, or choose another --checkpoint-dir")
