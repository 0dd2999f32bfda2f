"""What a process writes: an audit hook (sys.addaudithook) that records every path it opens for
writing, and every rename it makes (os.replace, as atomic writes end), from the moment `watch()`
is called. The rank probes save the list, so a test can tell which rank wrote a file, which the
files themselves cannot show."""
import os
import sys

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
written = []


def _hook(event, args):
    if event == "open":
        path, mode, flags = args
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
            (isinstance(flags, int) and flags & WRITE_FLAGS)
        if writes and isinstance(path, (str, bytes, os.PathLike)):
            written.append(os.path.abspath(os.fsdecode(path)))
    elif event == "os.rename":
        written.append(os.path.abspath(os.fsdecode(args[1])))


def watch():
    sys.addaudithook(_hook)


def under(folder):
    """The paths written so far inside `folder`."""
    root = os.path.abspath(folder) + os.sep
    return sorted({p for p in written if p.startswith(root)})
