"""devices.py: each local rank on its own share of the CPU cores, in fresh processes."""
import json
import os
import subprocess

import pytest
import torch

from helpers import PY, ROOT, assert_ok, probe_cmd, run
from sweeps import placement
from training.base.errors import UsageError
from training.run import devices


def place(calls, prefix=(), **env):
    """The placement after each share_cores(cpu, local_rank, local_size) call, in one new process."""
    full_env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    full_env.update(env)
    r = subprocess.run([*prefix, *probe_cmd("placement", json.dumps(calls))], cwd=ROOT,
                       env=full_env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


CORES = sorted(os.sched_getaffinity(0))
free = pytest.mark.skipif(len(CORES) < 2, reason="needs 2 or more usable cores")


@pytest.fixture(scope="module")
def unbound():
    # As under horovodrun: rank 1 of 2, rank 0 of 2, more ranks than cores, then alone
    # on the host (an elastic reset). Each call splits the cores the process began with.
    return place([[1, 2], [0, 2], [0, len(CORES) + 1], [0, 1]])


def test_core_share_splits_evenly():
    assert devices.core_share([0, 1], 1, 2) == ([1], 1)
    assert devices.core_share([0, 1, 2], 0, 2) == ([0], 1)  # no core left idle:
    assert devices.core_share([0, 1, 2], 1, 2) == ([1, 2], 2)  # the remainder goes to a rank
    assert [len(devices.core_share(list(range(6)), r, 4)[0]) for r in range(4)] == [1, 2, 1, 2]
    assert devices.core_share([0, 1], 0, 3) == ([0, 1], 1)  # more processes than cores
    assert devices.core_share([4, 5, 6, 7], 0, 1) == ([4, 5, 6, 7], 4)


@free
def test_local_ranks_get_their_own_cores(unbound):
    ordered = devices.ordered_cores(CORES)
    rank1, rank0 = unbound[0], unbound[1]
    want1, want0 = devices.core_share(ordered, 1, 2)[0], devices.core_share(ordered, 0, 2)[0]
    assert rank1["process"] == rank1["early"] == sorted(want1)  # every thread, also one started before
    assert rank0["process"] == rank0["early"] == sorted(want0)
    assert rank1["threads"] == len(want1) and rank0["threads"] == len(want0)
    assert not set(want0) & set(want1)


@free
def test_more_local_ranks_than_cores_share_them_all(unbound):
    assert unbound[2]["process"] == CORES and unbound[2]["threads"] == 1


@free
def test_elastic_reset_splits_the_starting_cores_anew(unbound):
    assert unbound[3]["process"] == unbound[3]["early"] == CORES and unbound[3]["threads"] == len(CORES)


@free
def test_launcher_binding_and_omp_num_threads_are_kept():
    got = place([[1, 2]], prefix=("taskset", "-c", str(CORES[0])))[0]  # as mpirun --bind-to core leaves it
    assert got["process"] == [CORES[0]] and got["threads"] == 1
    got = place([[1, 2]], OMP_NUM_THREADS="1")[0]
    assert got["process"] == CORES and got["threads"] == 1


def test_threads_chosen_tells_the_users_setting_from_torchruns(monkeypatch):
    # torchrun's own OMP_NUM_THREADS=1 (for nproc_per_node > 1) is missing from the environment
    # it was started with, its workers' parent's; tests/test_main_ddp.py shows it under torchrun.
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert not devices.threads_chosen()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert devices.threads_chosen()  # the user's, without torchrun
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    try:
        with open(f"/proc/{os.getppid()}/environ", "rb") as f:
            parent_set_it = any(e.startswith(b"OMP_NUM_THREADS=") for e in f.read().split(b"\0"))
    except OSError:  # a parent not ours to read (pytest under init): the setting is kept
        parent_set_it = True
    assert devices.threads_chosen() == parent_set_it
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert devices.threads_chosen()  # torchrun only ever sets 1


@pytest.mark.parametrize("local_rank, local_size, visible, want", [
    (0, 1, 1, 0), (3, 4, 4, 3), (3, 4, 8, 3),  # a GPU for every process: its own
    (1, 2, 1, 0), (5, 8, 1, 0),  # one GPU shown to each process (srun --gpus-per-task=1)
])
def test_gpu_by_local_rank_and_visible_devices(local_rank, local_size, visible, want):
    assert devices.gpu_index(local_rank, local_size, visible) == want


def test_fewer_gpus_than_local_processes_is_one_line(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(UsageError, match=r"^4 processes on this host, but 2 GPUs visible to each "
                                         r"\(CUDA_VISIBLE_DEVICES=0,1\); start at most 2 processes"):
        devices.gpu_index(3, 4, 2)


def test_share_cores_leaves_a_gpu_process_alone():
    before = (os.sched_getaffinity(0), torch.get_num_threads())
    devices.share_cores(torch.device("cuda", 0), 1, 2)
    assert (os.sched_getaffinity(0), torch.get_num_threads()) == before


def test_a_sweep_process_takes_a_gpu_by_its_slot_on_the_host(monkeypatch):
    # Slot modulo the GPUs, by the ids CUDA_VISIBLE_DEVICES shows: consecutive slots (one run's
    # group) get different GPUs while the group is no larger than the host's GPUs.
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [placement.shared_gpu(s, 4) for s in range(6)] == ["0", "1", "2", "3", "0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert [placement.shared_gpu(s, 2) for s in range(3)] == ["4", "6", "4"]


SHARE = """
import os, sys, threading
from sweeps import placement
early = threading.Event()
thread = threading.Thread(target=early.wait, daemon=True)  # one that exists before the placement
thread.start()
slot, slots = placement.node_slot()
placement.take_host_share(slot, slots)
assert os.sched_getaffinity(thread.native_id) == os.sched_getaffinity(0)  # every thread moved
with open(f"{sys.argv[1]}/slot{slot}", "w") as f:
    print(slots, *sorted(os.sched_getaffinity(0)), file=f)
"""


def test_sweep_processes_on_one_host_take_different_shares_of_it(tmp_path):
    # Two runs of one rank on one host: each run's Horovod would see one process (local rank 0
    # both), so the sweep first narrows each process to its slot's share of the host (its
    # cores here, every thread of it; its GPU on a GPU host), by its rank among the host's processes.
    assert_ok(run(["mpirun", "-np", "2", "--bind-to", "none", "-x", f"PYTHONPATH={ROOT}", PY, "-c", SHARE,
                   tmp_path]))
    cores = sorted(os.sched_getaffinity(0))
    said = [(tmp_path / f"slot{s}").read_text().split() for s in (0, 1)]
    assert [int(x[0]) for x in said] == [2, 2]
    shares = [list(map(int, x[1:])) for x in said]
    if len(cores) >= 2:  # disjoint halves of this machine's cores
        assert not set(shares[0]) & set(shares[1]) and sorted(shares[0] + shares[1]) == cores, shares
    else:
        assert shares == [cores, cores]
