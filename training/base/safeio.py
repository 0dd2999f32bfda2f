"""Files that are never seen half-written: every file this project writes goes through here.

`atomic_write` writes to a temporary file with a unique name beside the target,
fsyncs it and renames it over the target, so a reader, a crash, a full disk or
another process writing the same file at the same moment never leaves a partial
file behind; the file gets the mode a plain open() would give it (0666 less the
umask), so a group shares what the run writes where the umask lets it. `once` does
a piece of work once however many processes, on however many hosts sharing the
folder, ask for it at the same time; `hold` keeps a folder for one process at a time
(until it ends, or `let_go`).
Nothing here knows what the files hold.
"""
import contextlib
import csv
import errno
import fcntl
import io
import os
import tempfile
import time

from training.base.errors import TrainerError


def atomic_write(path, write, hint="free space or fix permissions, then --resume"):
    """Call write(file) on a temporary file beside path, fsync it, then rename it
    over path. A crash or a full disk leaves the old file as it was; `hint` ends
    the one-line error that an OSError becomes."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp's 0600 would keep the file from the group
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
            raise TrainerError(f"could not write {path} ({cause.strerror or cause}); "
                               "the previous file "
                               f"is unchanged: {hint}") from e
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)



def atomic_write_csv(path, columns, rows):
    """A CSV of `rows` (dicts; keys beyond `columns` left out), header first, through
    atomic_write."""
    text = io.StringIO()
    writer = csv.DictWriter(text, columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(path, lambda f: f.write(text.getvalue().encode()))

def umask():
    """This process's umask, read without changing it (Linux's /proc), else by setting it back."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _lock_file(path, hint):
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise TrainerError(f"cannot create the lock file {path} ({e.strerror or e}): {hint}") from e


# What flock fails with where a filesystem keeps no locks: Lustre mounted `noflock` (ENOSYS),
# an NFS mount without its lock service (ENOLCK), some FUSE filesystems (EOPNOTSUPP).
NO_LOCKS = (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP)


def _flock(fd, op, path):
    """fcntl.flock, with a filesystem that keeps no locks turned into one line: without them,
    two processes could both believe they hold the file."""
    try:
        fcntl.flock(fd, op)
    except OSError as e:
        if e.errno not in NO_LOCKS:
            raise
        raise TrainerError(f"cannot lock {path}: its filesystem keeps no file locks "
                           f"({e.strerror}); put the folder on one that does (a local disk, "
                           "NFS v4, Lustre mounted with -o flock)") from None


@contextlib.contextmanager
def locked(path, hint="fix the folder's permissions"):
    """Hold an exclusive lock on the file `path` (made if missing) for the block.

    fcntl.flock: the kernel releases it when the process ends, however it ends, and
    NFS v4 carries it between hosts. The file is left behind, empty: removing a lock
    file that another process may be about to lock would let two in at once."""
    fd = _lock_file(path, hint)
    try:
        _flock(fd, fcntl.LOCK_EX, path)
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


_held_locks = {}  # lock file path -> its descriptor, open for the life of the process


def hold(path, owner, hint="fix the folder's permissions"):
    """Take the exclusive lock on the file `path` (made if missing) without waiting, and keep
    it for the rest of this process's life: the kernel drops it when the process ends,
    however it ends, and NFS v4 carries it between hosts. Writes `owner` into the file for
    whoever finds it held. Returns None once held (again if already held here), else what
    the holder wrote ("" if it has not written yet)."""
    path = os.path.abspath(path)
    if path in _held_locks:
        return None
    fd = _lock_file(path, hint)
    try:
        _flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, path)
    except BlockingIOError:
        with os.fdopen(fd, "rb") as f:
            return _owner(f)
    except TrainerError:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, owner.encode() + b"\n", 0)
    _held_locks[path] = fd
    return None


def let_go(path):
    """Let go of the lock `hold` took on `path` before the process ends (nothing where this
    process does not hold it): a process that trains one run after another (a search's group)
    holds each run's folder only while it trains it."""
    fd = _held_locks.pop(os.path.abspath(path), None)
    if fd is not None:
        os.close(fd)  # the lock goes with the descriptor


def holder_of(path):
    """Who holds the lock `hold` takes on `path`: what the holder wrote ("" if not yet),
    or None when no other process holds it or the file does not exist. Creates nothing."""
    path = os.path.abspath(path)
    if path in _held_locks:
        return None
    try:
        f = open(path, "rb")
    except OSError:
        return None
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _owner(f)
        except OSError:
            return None
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return None


def _owner(f):
    """What the holder of the lock on the open file `f` wrote into it; it writes its name just
    after taking the lock, so a second is given for that ("" if still nothing)."""
    for _ in range(20):
        owner = f.read().decode(errors="replace").strip()
        if owner:
            return owner
        time.sleep(0.05)
        f.seek(0)
    return ""
