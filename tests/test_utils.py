"""utils.py in process: the LR schedule, host syncs in the step loop, checkpoint helpers."""
import math
import os

import pytest
import torch

import data
import utils
from errors import TrainerError


def test_cosine_schedule_per_epoch():
    s = utils.LRSchedule(0.1, 0, 200)
    assert s(0) == pytest.approx(0.1)
    assert s(100.7) == pytest.approx(0.05)  # stepped per epoch: the fraction is ignored
    assert s(199) == pytest.approx(0.1 * 0.5 * (1 + math.cos(math.pi * 199 / 200)))


def test_warmup_ramps_from_lr_to_lr_times_size():
    s = utils.LRSchedule(0.1, 0, 100, scale=4, warmup_epochs=5)
    assert s(0) == pytest.approx(0.1)  # starts at --lr
    assert s(2.5) == pytest.approx(0.25 * 0.5 * (1 + math.cos(math.pi * 2 / 100)))
    assert s(5) == pytest.approx(0.4 * 0.5 * (1 + math.cos(math.pi * 5 / 100)))  # then lr x size
    assert utils.LRSchedule(0.1, 0, 100, scale=1, warmup_epochs=5)(0) == pytest.approx(0.1)


def test_resume_with_new_lr_anneals_over_the_rest():
    s = utils.LRSchedule(0.01, 120, 200)
    assert s(120) == pytest.approx(0.01)
    assert s(160) == pytest.approx(0.005)
    assert s.state_dict() == {"base_lr": 0.01, "start_epoch": 120}


def _count_host_syncs(monkeypatch):
    """Count the Tensor methods that copy a value to the host (each a device sync on CUDA)."""
    calls = []
    for name in ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "cpu", "numpy"):
        orig = getattr(torch.Tensor, name)

        def counted(self, *a, _orig=orig, _name=name, **k):
            calls.append(_name)
            return _orig(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, counted)
    return calls


def test_training_step_loop_has_no_host_sync(monkeypatch):
    args = utils.parse_args(utils.build_parser(""), ["--arch", "lenet", "--batch-size", "8",
                                                     "--log-interval", "1000"])
    torch.manual_seed(0)
    images = torch.randint(0, 256, (80, 3, 32, 32), dtype=torch.uint8)
    loader = data.DeviceLoader(images, torch.arange(80) % 10, 8, train=True)
    model = utils.build_model(args, torch.device("cpu"))
    optimizer = utils.make_optimizer(model)
    scaler = utils.make_scaler(args, torch.device("cpu"))
    schedule = utils.LRSchedule(0.1, 0, 10)
    calls = _count_host_syncs(monkeypatch)
    out = utils.train_epoch(model, loader, optimizer, scaler, schedule, 0, args, utils.Progress(False))
    assert len(loader) == 10
    assert calls == ["tolist"], "only the end-of-epoch reduction may read values back"
    assert out["images"] == 80
    # The instrument works: a log interval inside the epoch adds exactly its readings.
    calls.clear()
    args = utils.parse_args(utils.build_parser(""), ["--arch", "lenet", "--batch-size", "8", "--log-interval", "5"])
    utils.train_epoch(model, loader, optimizer, scaler, schedule, 1, args, utils.Progress(False))
    assert calls == ["tolist", "tolist"]


def test_pytorch_cifar_checkpoint_mapping():
    sd = {"module.conv1.weight": torch.zeros(1)}
    ck = utils.as_trainer_checkpoint({"net": sd, "acc": 93.5, "epoch": 199}, "x.pth")
    assert ck["model"] == {"conv1.weight": sd["module.conv1.weight"]}
    assert ck["epoch"] == 200 and ck["best_acc"] == pytest.approx(0.935)
    with pytest.raises(TrainerError, match="neither"):
        utils.as_trainer_checkpoint({"weights": 1}, "x.pth")


def test_atomic_write_keeps_old_file_on_error(tmp_path):
    path = tmp_path / "f"
    path.write_text("old")

    def fail(f):
        f.write(b"partial")
        raise OSError(28, "No space left on device")
    with pytest.raises(TrainerError, match="No space left on device"):
        utils.atomic_write(str(path), fail)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_replace_batchnorm_keeps_state():
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    net[1].running_mean.fill_(0.5)

    class MyBN(torch.nn.BatchNorm2d):
        pass
    utils.replace_batchnorm(net, MyBN)
    assert isinstance(net[1], MyBN) and torch.all(net[1].running_mean == 0.5)


# ---------------------------------------------------------------------------
# CPU placement: each local rank on its own share of the cores

PLACEMENT_PROBE = """
import json, os, sys, threading, torch, utils
early = threading.Event()
t = threading.Thread(target=early.wait, daemon=True)  # a thread that exists before the calls
t.start()
states = []
for local_rank, local_size in json.loads(sys.argv[1]):
    utils.pick_device(local_rank, local_size)
    states.append({"process": sorted(os.sched_getaffinity(0)), "early": sorted(os.sched_getaffinity(t.native_id)),
                   "threads": torch.get_num_threads()})
print(json.dumps(states))
"""


def place(calls, prefix=(), **env):
    """The placement after each pick_device(local_rank, local_size) call, in one new process."""
    import json
    import subprocess
    import sys
    from conftest import ROOT
    full_env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    full_env.update(env)
    r = subprocess.run([*prefix, sys.executable, "-c", PLACEMENT_PROBE, json.dumps(calls)], cwd=ROOT,
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
    assert utils.core_share([0, 1], 1, 2) == ([1], 1)
    assert utils.core_share([0, 1, 2], 0, 2) == ([0], 1)  # no core left idle:
    assert utils.core_share([0, 1, 2], 1, 2) == ([1, 2], 2)  # the remainder goes to a rank
    assert [len(utils.core_share(list(range(6)), r, 4)[0]) for r in range(4)] == [1, 2, 1, 2]
    assert utils.core_share([0, 1], 0, 3) == ([0, 1], 1)  # more processes than cores
    assert utils.core_share([4, 5, 6, 7], 0, 1) == ([4, 5, 6, 7], 4)


@free
def test_local_ranks_get_their_own_cores(unbound):
    ordered = utils.ordered_cores(CORES)
    rank1, rank0 = unbound[0], unbound[1]
    want1, want0 = utils.core_share(ordered, 1, 2)[0], utils.core_share(ordered, 0, 2)[0]
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
