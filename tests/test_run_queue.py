"""run_queue.py: every run is taken once, by whichever process asks first, also from processes
taking at the same time."""
import multiprocessing

from sweeps.run_queue import RunQueue


def take_many(folder, n, out):
    queue = RunQueue(folder)
    out.put([queue.take() for _ in range(n)])


def test_runs_are_taken_in_order_and_once_across_processes(tmp_path):
    queue = RunQueue(str(tmp_path))
    queue.reset()
    assert [queue.take(), queue.take()] == [0, 1]
    queue.reset()  # queued again from the first
    out = multiprocessing.get_context("spawn").Queue()
    takers = [multiprocessing.get_context("spawn").Process(target=take_many, args=(str(tmp_path), 50, out))
              for _ in range(3)]
    for p in takers:
        p.start()
    taken = [i for _ in takers for i in out.get(timeout=120)]
    for p in takers:
        p.join()
    assert sorted(taken) == list(range(150)) and queue.take() == 150
