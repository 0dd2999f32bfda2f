"""safeio.py: atomic writes, and work done once under a lock."""
import threading
import time

import pytest

import safeio
from errors import TrainerError


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
