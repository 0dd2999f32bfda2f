"""Files that are never seen half-written: every file this project writes goes through here.

`atomic_write` writes to a temporary file with a unique name beside the target,
fsyncs it and renames it over the target, so a reader, a crash, a full disk or
another process writing the same file at the same moment never leaves a partial
file behind. `once` does a piece of work once however many processes, on however
many hosts sharing the folder, ask for it at the same time. Nothing here knows what
the files hold.
"""
import contextlib
import fcntl
import os
import tempfile

from errors import TrainerError


def atomic_write(path, write, hint="free space or fix permissions, then --resume"):
    """Call write(file) on a temporary file beside path, fsync it, then rename it
    over path. A crash or a full disk leaves the old file as it was; `hint` ends
    the one-line error that an OSError becomes."""
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
                               f"is unchanged: {hint}") from e
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


@contextlib.contextmanager
def locked(path, hint="fix the folder's permissions"):
    """Hold an exclusive lock on the file `path` (made if missing) for the block.

    fcntl.flock: the kernel releases it when the process ends, however it ends, and
    NFS v4 carries it between hosts. The file is left behind, empty: removing a lock
    file that another process may be about to lock would let two in at once."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise TrainerError(f"cannot create the lock file {path} ({e.strerror or e}): {hint}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # and with it the lock


def once(lock_path, done, work, hint="fix the folder's permissions"):
    """Run work() unless done(), under the lock at `lock_path`, checking done() again
    once the lock is held: of any number of processes calling this at once, one does
    the work, and the others wait for it and then find it done. work() must make
    done() true only when it has finished (its last write an atomic rename). Returns
    whether this process did the work."""
    if done():
        return False
    with locked(lock_path, hint):
        if done():
            return False
        work()
        return True
