"""safeio.py: atomic writes and their modes (a whole run's files under a umask too), work done once
under a lock, a held folder."""
import errno
import os
import shutil
import stat
import subprocess
import threading
import time

import pytest

from helpers import PY, ROOT, assert_one_line_error, common_args, probe_cmd, run, run_main, skip_or_fail
from training.base import safeio
from training.base.errors import TrainerError


def test_atomic_write_keeps_old_file_on_error(tmp_path):
    path = tmp_path / "f"
    path.write_text("old")

    def fail(f):
        f.write(b"partial")
        raise OSError(28, "No space left on device")
    with pytest.raises(TrainerError, match="No space left on device"):
        safeio.atomic_write(str(path), fail)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_once_does_the_work_once_among_concurrent_callers(tmp_path):
    """Eight callers at once (threads: each opens the lock file anew, so flock keeps them
    apart as it keeps processes apart): one works, the others wait, then find it done."""
    target, calls = tmp_path / "data" / "done", []

    def work():
        calls.append(1)
        time.sleep(0.3)  # long enough for every other caller to arrive and wait
        safeio.atomic_write(str(target), lambda f: f.write(b"whole"))

    def caller(results):
        results.append(safeio.once(str(tmp_path / "data" / ".lock"), target.exists, work))

    results = []
    threads = [threading.Thread(target=caller, args=(results,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results) == [False] * 7 + [True] and len(calls) == 1
    assert target.read_bytes() == b"whole"
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [".lock", "done"]


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o007, 0o660)])
def test_atomic_write_gives_the_mode_open_would(tmp_path, mask, mode):
    old = os.umask(mask)
    try:
        assert safeio.umask() == mask
        safeio.atomic_write(str(tmp_path / "f"), lambda f: f.write(b"x"))
        with open(tmp_path / "plain", "w"):
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "f").st_mode) == mode
    assert stat.S_IMODE(os.stat(tmp_path / "plain").st_mode) == mode


def test_hold_is_one_process_at_a_time_until_the_holder_ends(tmp_path):
    lock = tmp_path / "run" / ".run.lock"
    holder = subprocess.Popen(probe_cmd("holder", lock), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert safeio.hold(str(lock), "this test") == f"the holder probe, process {holder.pid}"
    finally:
        holder.kill()  # SIGKILL: the kernel drops the lock with the process
        holder.wait()
    assert safeio.hold(str(lock), "this test") is None
    assert safeio.hold(str(lock), "this test") is None, "held already: again"
    assert lock.read_text() == "this test\n"
    again = subprocess.run(probe_cmd("holder", lock), capture_output=True, text=True, timeout=60)
    assert again.stdout == "refused: this test\n"


def test_holder_of_names_the_holder_and_creates_nothing(tmp_path):
    lock = tmp_path / "run" / ".run.lock"
    assert safeio.holder_of(str(lock)) is None and not (tmp_path / "run").exists()
    holder = subprocess.Popen(probe_cmd("holder", lock), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert safeio.holder_of(str(lock)) == f"the holder probe, process {holder.pid}"
        assert safeio.holder_of(str(lock)) is not None, "peeking does not take the lock"
    finally:
        holder.kill()
        holder.wait()
    assert safeio.holder_of(str(lock)) is None
    assert safeio.hold(str(lock), "this test") is None


def test_a_run_writes_files_with_the_mode_of_its_umask(tmp_path):
    # A fresh --data-dir, so the generated batches are checked too.
    r = run_main(common_args(tmp_path / "data", tmp_path / "ck", epochs=1),
                 preexec_fn=lambda: os.umask(0o027))
    assert r.returncode == 0, r.stderr[-2000:]
    files = [os.path.join(d, f) for top in ("data", "ck") for d, _, fs in os.walk(tmp_path / top) for f in fs]
    names = {os.path.basename(f) for f in files}
    assert {"ckpt.pth", "best.pth", "metrics.csv", "curves.svg", "data_batch_1", "test_batch"} <= names
    modes = {f: oct(stat.S_IMODE(os.stat(f).st_mode)) for f in files}
    assert set(modes.values()) == {"0o640"}, modes


@pytest.mark.parametrize("code", safeio.NO_LOCKS)
def test_a_filesystem_without_locks_is_one_line_and_other_errors_pass_through(tmp_path, monkeypatch, code):
    def no_locks(fd, op):
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(safeio.fcntl, "flock", no_locks)
    for take in (lambda p: safeio.hold(p, "this test"), lambda p: safeio.once(p, lambda: False, lambda: None)):
        with pytest.raises(TrainerError, match="keeps no file locks .* Lustre mounted with -o flock"):
            take(str(tmp_path / "lock"))
    monkeypatch.setattr(safeio.fcntl, "flock", lambda fd, op: (_ for _ in ()).throw(OSError(errno.EBADF, "bad")))
    with pytest.raises(OSError):
        safeio.hold(str(tmp_path / "other"), "this test")


def test_a_run_and_a_search_on_a_filesystem_without_locks_stop_in_one_line(data_dir, tmp_path):
    # Lustre mounted `noflock` answers flock() with ENOSYS. No such filesystem can be made here,
    # so a library loaded first (LD_PRELOAD) answers every flock() of the process the same way.
    src, lib = tmp_path / "noflock.c", tmp_path / "libnoflock.so"
    src.write_text("#include <errno.h>\nint flock(int fd, int op) { (void)fd; (void)op; errno = ENOSYS; return -1; }\n")
    if not shutil.which("gcc"):
        skip_or_fail("gcc is not installed: it builds the library that takes flock() away")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=60)
    no_locks = {"LD_PRELOAD": str(lib)}
    r = run_main(common_args(data_dir, tmp_path / "ck", epochs=1), env_extra=no_locks)
    assert_one_line_error(r, "keeps no file locks (Function not implemented)", "-o flock", code=1)
    assert not (tmp_path / "ck" / "ckpt.pth").exists()
    r = run([PY, os.path.join(ROOT, "main_sweep.py"), "--search", "lr=log:0.01:0.1", "--trials", "1",
             *common_args(data_dir, tmp_path / "study", epochs=1)], env_extra=no_locks)
    assert_one_line_error(r, "keeps no file locks (Function not implemented)", "--storage postgresql://", code=1)
    assert not os.path.exists(tmp_path / "study" / "study.journal")
