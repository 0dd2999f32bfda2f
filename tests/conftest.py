"""The fixtures, and how `make test` shares the tests between its two workers; the helpers the
tests share are in helpers.py."""
import os

# Idle OpenMP threads sleep instead of spinning. Tests start several processes
# on 2 cores, and spinning threads of one starve the others. Set before torch
# is imported, so it holds for this process and the ones it starts.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import hashlib  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

import helpers  # noqa: E402

if helpers.ROOT not in sys.path:
    sys.path.insert(0, helpers.ROOT)
# Inductor's compiled graphs (--compile's C++ on the CPU) kept between runs: a graph compiled
# once is loaded, not compiled again (test_compile.py: 93 s cold, 51 s warm, alone on 2 cores).
# Its keys hold the graph, torch's version and Inductor's settings, so a changed model compiles.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(helpers.CACHE, "inductor"))

from training.run import data  # noqa: E402

# `make test` runs the suite on two pytest-xdist workers (-n 2): most tests wait on processes,
# daemons and links, and one worker at a time left a core idle. Tests that share something
# across a module run on one worker, one after another: the namespace hosts' link-local subnets
# and Slurm daemons (and one_host_np2, which they all compare with), and real CIFAR-10 written
# once, the MLflow server of test_tracking, test_search's study (with its MLflow server) and
# test_study_store's PostgreSQL server, run once, not once per worker; and test_compile's two
# tests in order, so that the second's Horovod job finds the first's compiled graphs in
# Inductor's cache (12 s of CPU less) rather than compiling them beside it. Every other test is
# a unit of its own, sent to whichever worker is free.
ONE_WORKER = {"test_multihost": "hosts", "test_slurm": "hosts", "test_container": "hosts",
              "test_real_data": "real_data", "test_tracking": "mlflow", "test_search": "study",
              "test_study_store": "postgres", "test_compile": "compile"}
# Tests that time a link or a sleep, which a second worker's load would skew: marked `alone`,
# and `make test` runs them after the others, by themselves.
ALONE = {"test_scaling", "test_emulate"}


def module_of(nodeid):
    return nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")


def unit_of(nodeid):
    """The unit a test is scheduled in: its module's ONE_WORKER group, or itself."""
    return ONE_WORKER.get(module_of(nodeid), nodeid)


def pytest_configure(config):
    config.addinivalue_line("markers", "alone: times something; run without other tests beside it")


def pytest_itemcollected(item):
    if module_of(item.nodeid) in ALONE:
        item.add_marker(pytest.mark.alone)


def pytest_xdist_make_scheduler(config, log):
    """xdist's scheduling by scope, the scope being unit_of's unit."""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return unit_of(nodeid)
    return ByGroup(config, log)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """Synthetic CIFAR-format data of helpers.SYNTH images, generated once for the session
    where `--data-dir DIR --dataset synthetic --synthetic-size SYNTH` reads it."""
    d = tmp_path_factory.mktemp("data")
    folder = data.synthetic_folder(str(d), helpers.SYNTH, seed=0)
    data.generate_synthetic(folder, helpers.SYNTH, helpers.SYNTH // 5, seed=0)
    return d


@pytest.fixture
def jobs(tmp_path):
    """start(cmd) runs a helpers.Job in the background; every job is killed when the test ends."""
    started = []

    def start(cmd, env_extra=None):
        job = helpers.Job(cmd, tmp_path / f"job{len(started)}.log", env_extra)
        started.append(job)
        return job

    yield start
    for job in started:  # a failed test leaves no process behind
        job.kill()


@pytest.fixture(scope="session")
def real_data(tmp_path_factory):
    """Real CIFAR-10, all 60,000 images (a JPEG copy in the original order, with the original
    labels), written once for the session in the standard layout from the pack in
    ../shared/data beside the clone: the folder to pass as --data-dir. A clone without it
    skips the tests that need it, except where REQUIRE_REAL_DATA is set (CI)."""
    maker = helpers.REAL_DATA_MAKER
    if not os.path.isfile(maker):
        why = f"real CIFAR-10 needs {os.path.normpath(maker)}, which this clone does not have"
        if os.environ.get("REQUIRE_REAL_DATA"):
            pytest.fail(why)
        pytest.skip(why)
    # Written once per pack and kept, as `make setup` keeps Horovod's wheel: writing it takes
    # about a minute on 2 cores. The pack's and the maker's hash name the folder.
    digest = hashlib.sha256()
    for f in (maker, os.path.join(os.path.dirname(maker), "cifar10-jpeg.npz")):
        with open(f, "rb") as fh:
            digest.update(fh.read())
    cache = helpers.CACHE
    d = os.path.join(cache, f"real-cifar10-{digest.hexdigest()[:16]}")
    if not os.path.isdir(d):
        os.makedirs(cache, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".real-cifar10-", dir=cache)
        subprocess.run([helpers.PY, maker, tmp], check=True, capture_output=True, timeout=300)
        try:
            os.rename(tmp, d)  # whole, or not at all; a worker that wrote it first wins
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return d


@pytest.fixture(scope="session")
def one_host_np2(data_dir, tmp_path_factory):
    """Rank 0's model after a one-host np=2 run (horovodrun --gloo, one thread per rank, epoch 2
    of helpers.CLUSTER_EPOCHS): what runs across hosts and Slurm nodes must equal, bit for bit."""
    probe = tmp_path_factory.mktemp("one-host-np2")
    args = helpers.common_args(data_dir, probe / "ck", "--stop-at", 2, epochs=helpers.CLUSTER_EPOCHS)
    helpers.assert_ok(helpers.run_horovod(2, args, "gloo", probe=probe, env_extra=helpers.ONE_THREAD,
                                          timeout=300))
    return helpers.load_ranks(probe, 2)[0]["model"]
