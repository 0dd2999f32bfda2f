"""Across hosts: the trainers on a real two-host cluster made by scripts/local_cluster.sh.

The hosts are network namespaces on a bridge, each with its own hostname, link-local
address and sshd, sharing this machine's filesystem as an NFS home would. The launchers
run on host 1 and reach host 2 by ssh, as on real machines. One cluster serves the whole
module; it is torn down at the end, also when a test or the set-up fails, and whatever
a test left running on the hosts is ended after each test.

Every rank runs one thread (OMP_NUM_THREADS=1), here and in the one-host reference run
(conftest.py's one_host_np2): the hosts share this machine's cores, and a rank alone on its
host would otherwise take all of them, which changes the floating-point sums, so no
comparison would be bitwise.
Without root (namespaces) the module is skipped, in one line; under CI it fails instead.
"""
import os
import signal
import subprocess
import time

import pytest

from helpers import (
    BIN,
    CLUSTER_EPOCHS,
    CLUSTER_JOB_TIMEOUT,
    ONE_THREAD,
    PY,
    ROOT,
    UNTIL_ENDED,
    LocalCluster,
    assert_ok,
    assert_ranks_identical,
    assert_states_equal,
    common_args,
    is_gone,
    load_ckpt,
    load_ranks,
    metrics_rows,
    probe_cmd,
    rank_pids,
    read_metrics,
    run_horovod,
    trainer_pids,
    wait_until,
    without_lr,
)
from training.run import tracking

DISCOVER = os.path.join(ROOT, "scripts", "discover_hosts.sh")
JOB_TIMEOUT = CLUSTER_JOB_TIMEOUT


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    c = LocalCluster(tmp_path_factory.mktemp("cluster"))
    request.addfinalizer(c.down)  # first: a failed `up` is torn down too
    c.up(2)
    return c


@pytest.fixture(autouse=True)
def reaped(cluster):
    """After each test, nothing it started is left running on the hosts (a remote rank
    is not in its launcher's process group)."""
    yield
    cluster.script("reap", timeout=60)


def assert_two_hosts(ranks, cluster, local_size=1):
    """Each rank ran on the host the launcher put it on, and Horovod saw the cluster."""
    names = [f"{cluster.env['CLUSTER_NAME']}-h{1 + r * 2 // len(ranks)}" for r in range(len(ranks))]
    assert [r["host"] for r in ranks] == names
    assert [(r["size"], r["cross_size"], r["local_size"]) for r in ranks] == \
        [(len(ranks), 2, local_size)] * len(ranks)


# ---------------------------------------------------------------------------
# Training across hosts equals training on one

def test_mpirun_hostfile_trains_across_hosts_bitwise(cluster, one_host_np2, tmp_path):
    # A fresh --data-dir: each host's local rank 0 prepares it, both at once, in one folder.
    args = common_args(tmp_path / "data", tmp_path / "ck", "--stop-at", 2, epochs=CLUSTER_EPOCHS)
    assert_ok(cluster.run("mpirun", 2, args, probe=tmp_path))
    ranks = load_ranks(tmp_path, 2)
    assert_two_hosts(ranks, cluster)
    assert_states_equal(ranks[1]["model"], one_host_np2, "rank 1 and the one-host run")
    assert_states_equal(load_ckpt(tmp_path / "ck" / "ckpt.pth")["model"], one_host_np2, "the checkpoint")


def test_horovodrun_gloo_trains_and_resumes_across_hosts_bitwise(cluster, one_host_np2, data_dir, tmp_path):
    ck = tmp_path / "ck"
    first = assert_ok(cluster.run("gloo", 2, common_args(data_dir, ck, "--stop-at", 1, epochs=CLUSTER_EPOCHS)))
    assert load_ckpt(ck / "ckpt.pth")["epoch"] == 1
    args = without_lr(common_args(data_dir, ck, "--resume", "--stop-at", 2, epochs=CLUSTER_EPOCHS))
    second = assert_ok(cluster.run("gloo", 2, args, probe=tmp_path))
    ranks = load_ranks(tmp_path, 2)
    assert_two_hosts(ranks, cluster)
    assert_states_equal(ranks[1]["model"], one_host_np2, "rank 1 and the one-host run")
    # The resume says what it continues, from rank 0 alone.
    said = [ln for ln in second.stdout.splitlines() if "resuming" in ln]
    assert len(said) == 1 and said[0].startswith("[0]<stdout>:resuming ") and "after epoch 1" in said[0] \
        and "the saved cosine" in said[0], second.stdout[-3000:]
    # Rank 0 alone wrote: one set of files, and each launch's TensorBoard file names host 1.
    assert [int(r["epoch"]) for r in read_metrics(ck)] == [1, 2]
    assert sorted(os.listdir(ck)) == [".run.lock", "best.pth", "ckpt.pth", "curves.svg", "metrics.csv", "tb"]
    events = [f for f in os.listdir(ck / "tb") if f != "hparams"]
    assert len(events) == 2 and all(f".{cluster.env['CLUSTER_NAME']}-h1." in f for f in events), events
    for out in (first.stdout, second.stdout):
        epoch_lines = [ln for ln in out.splitlines() if "]<stdout>:epoch " in ln]
        assert epoch_lines and all(ln.startswith("[0]") for ln in epoch_lines), out[-2000:]


def test_horovodrun_mpi_four_ranks_on_two_slots_per_host(cluster, data_dir, tmp_path):
    hosts = ",".join(f"{a}:2" for a in cluster.addresses)
    assert_ok(cluster.run("mpi", 4, common_args(data_dir, tmp_path / "ck", epochs=1), probe=tmp_path,
                          hosts=hosts))
    ranks = load_ranks(tmp_path, 4)
    assert_two_hosts(ranks, cluster, local_size=2)
    assert_ranks_identical(ranks)


# ---------------------------------------------------------------------------
# Failures across hosts

def nodes_monitored(store, ck):
    """The hosts whose system metrics (--mlflow-system-metrics) are in the run, once rank 0 has
    made it (before, a client would make the store's tables beside it)."""
    if not (ck / tracking.RUN_FILE).exists():
        return set()
    from mlflow.tracking import MlflowClient
    run = MlflowClient(store).get_run(tracking.read_run_file(ck)["mlflow_run_id"])
    return {key.split("/")[1] for key in run.data.metrics if key.startswith("system/") and key.count("/") == 2}


def test_kill_9_on_the_second_host_ends_the_job_and_resume_loses_nothing(cluster, data_dir, tmp_path, jobs):
    # Tracked in an MLflow store on the filesystem the hosts share, with --mlflow-system-metrics:
    # before the kill, the one run has each host's system metrics (rank 0's host's from rank 0,
    # the other's from its first process).
    ck, store = tmp_path / "ck", f"sqlite:///{tmp_path}/mlflow.db"
    args = common_args(data_dir, ck, "--warmup-epochs", 0, "--mlflow", store, "--mlflow-system-metrics",
                       epochs=UNTIL_ENDED)
    job = jobs(cluster.launch("gloo", 2, args),
               env_extra=dict(cluster.env, **ONE_THREAD, MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL="0.5"))
    hosts = {f"{cluster.env['CLUSTER_NAME']}-h{i}" for i in (1, 2)}
    wait_until(lambda: len(metrics_rows(ck)) >= 2 and nodes_monitored(store, ck) == hosts, 120,
               "2 finished epochs and both hosts' system metrics", job)
    pids = rank_pids("main_horovod.py", str(ck))
    remote = trainer_pids("main_horovod.py", str(ck), HOROVOD_HOSTNAME=cluster.addresses[1])
    assert set(pids) == {0, 1} and set(remote) == {pids[1]}, (pids, remote)
    os.kill(pids[1], signal.SIGKILL)
    t_kill = time.monotonic()
    rc = job.wait(timeout=30)  # fails the test if the job is still running
    assert time.monotonic() - t_kill < 30 and rc != 0
    assert all(is_gone(pid) for pid in pids.values()), "a rank is still running"
    done = load_ckpt(ck / "ckpt.pth")["epoch"]
    assert done >= 2
    # (Resuming across hosts is shown above; one process is enough to show nothing was lost.)
    resume = common_args(data_dir, ck, "--resume", "--warmup-epochs", 0, "--stop-at", done + 1, epochs=UNTIL_ENDED)
    assert_ok(run_horovod(1, resume, "python", timeout=JOB_TIMEOUT))
    epochs = [int(x["epoch"]) for x in read_metrics(ck)]
    assert epochs == list(range(1, done + 2)), "no finished epoch lost, none repeated"


# ---------------------------------------------------------------------------
# Elastic training across hosts

def test_elastic_removing_a_host_continues_training(cluster, data_dir, tmp_path, jobs):
    epochs, (host1, host2) = 6, cluster.addresses
    slots, ck = tmp_path / "slots", tmp_path / "ck"
    slots.write_text(f"{host1}:1\n{host2}:1\n")
    cmd = [os.path.join(BIN, "horovodrun"), "-np", 2, "--min-np", 1, "--max-np", 2,
           "--host-discovery-script", f"{DISCOVER} {slots}", *cluster.vars["CLUSTER_HOROVODRUN_ARGS"],
           PY, os.path.join(ROOT, "main_elastic.py"),
           *common_args(data_dir, ck, epochs=epochs, batch=8, lr=0.01)]
    job = jobs(cluster.on(1, cmd), env_extra=dict(cluster.env, **ONE_THREAD))
    wait_until(lambda: metrics_rows(ck), 90, "epoch 1 in metrics.csv", job)
    # As in test_main_elastic.py's e1: hold the other rank until rank 0 has heard of the
    # change, so that the run cannot end before the change reaches it.
    others = [pid for rank, pid in rank_pids("main_elastic.py", str(ck)).items() if rank != 0]
    assert len(others) == 1, job.output()[-3000:]
    os.kill(others[0], signal.SIGSTOP)
    try:
        slots.write_text(f"{host1}:1\n")  # host 2 leaves
        wait_until(lambda: "elastic: hosts removed" in job.output(), 30, "the removal heard by rank 0", job)
    finally:
        if not is_gone(others[0]):
            os.kill(others[0], signal.SIGCONT)
    rc = job.wait(JOB_TIMEOUT)
    out = job.output()
    assert rc == 0, out[-4000:]
    rows = read_metrics(ck)
    assert [int(r["epoch"]) for r in rows] == list(range(1, epochs + 1)), out[-3000:]
    sizes = [int(r["world_size"]) for r in rows]
    assert sizes[0] == 2 and sizes[-1] == 1 and sizes == sorted(sizes, reverse=True), sizes
    assert "world size 2 -> 1" in out
    assert load_ckpt(ck / "ckpt.pth")["epoch"] == epochs


# ---------------------------------------------------------------------------
# The cluster script cleans up after itself

def test_down_removes_everything_also_after_a_failed_up(tmp_path):
    c = LocalCluster(tmp_path / "state")
    name = c.env["CLUSTER_NAME"] = f"u{os.getpid() % 100000}"
    subprocess.run(["ip", "netns", "add", f"{name}-h2"], check=True)  # in host 2's way: up fails there
    try:
        r = c.script("up", "2")
        assert r.returncode not in (0, 77) and "up failed; removing what it made" in r.stderr, r.stderr
        assert not c.vars
        for _ in range(2):  # down again finds nothing left, and says so
            assert c.script("down").returncode == 0
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
        assert f"{name}-" not in namespaces and f"{name}-" not in links
        assert not trainer_pids(str(tmp_path / "state")), "host 1's sshd is still running"
        assert not (tmp_path / "state").exists()
    finally:
        c.script("down")
        subprocess.run(["ip", "netns", "del", f"{name}-h2"], capture_output=True)


# ---------------------------------------------------------------------------
# Interface selection

def test_gloo_uses_the_named_interface_when_host_names_resolve_to_loopback(cluster, data_dir, tmp_path):
    # Debian names the machine on a "127.0.1.1 hostname" line. Horovod 0.28.1's gloo binds
    # its training connections to what the host name resolves to, not to --network-interface,
    # and hvd.init() then fails with "connect [127.0.1.1]: Connection refused"; setup.sh
    # patches the build (its "Fix 9"). The hosts' resolver file is changed in place for this
    # run, as every host reads the same one.
    hosts = os.path.join(cluster.env["CLUSTER_DIR"], "hosts")
    with open(hosts) as f:
        before = f.read()
    names = [f"{cluster.env['CLUSTER_NAME']}-h{i}" for i in (1, 2)]
    try:
        with open(hosts, "w") as f:  # the same file (inode), so the hosts see the change
            f.write("".join(ln + "\n" for ln in before.splitlines() if not ln.endswith(tuple(names))))
            f.write(f"127.0.1.1 {' '.join(names)}\n")
        r = cluster.run("gloo", 2, common_args(data_dir, tmp_path / "ck", epochs=1), probe=tmp_path)
    finally:
        with open(hosts, "w") as f:
            f.write(before)
    assert_ok(r)
    assert_two_hosts(load_ranks(tmp_path, 2), cluster)


# ---------------------------------------------------------------------------
# torchrun across hosts (main_ddp.py)

def test_torchrun_ddp_across_two_hosts_equals_one_host(cluster, one_host_np2, data_dir, tmp_path, jobs):
    # One torchrun per host, as on real machines: they meet at host 1's c10d rendezvous, and
    # gloo is told the hosts' shared interface. main_ddp.py at np=2 equals main_horovod.py at
    # np=2 within 1e-6 (tests/test_main_ddp.py), so the Horovod reference serves here too.
    flags = cluster.vars["CLUSTER_HOROVODRUN_ARGS"]
    iface = flags[flags.index("--network-interface") + 1]
    endpoint = f"{cluster.addresses[0]}:{29500 + os.getpid() % 400}"
    args = common_args(data_dir, tmp_path / "ck", "--stop-at", 2, epochs=CLUSTER_EPOCHS)
    extra = dict(cluster.env, GLOO_SOCKET_IFNAME=iface, **ONE_THREAD)
    nodes = [jobs(cluster.on(i + 1, [os.path.join(BIN, "torchrun"), "--nnodes", 2, "--node_rank", i,
                                     "--nproc_per_node", 1, "--rdzv-backend", "c10d",
                                     "--rdzv-endpoint", endpoint, "--rdzv-id", f"ddp{os.getpid()}",
                                     *probe_cmd("rank_ddp", tmp_path)[1:], *args]),
                  env_extra=extra) for i in range(2)]
    for node in nodes:
        assert node.wait(timeout=JOB_TIMEOUT) == 0, node.output()[-4000:]
    ranks = load_ranks(tmp_path, 2)
    assert [r["size"] for r in ranks] == [2, 2] and [r["local_size"] for r in ranks] == [1, 1]
    assert sorted(r["host"] for r in ranks) == [f"{cluster.env['CLUSTER_NAME']}-h{i}" for i in (1, 2)]
    for r in ranks:
        assert_states_equal(r["model"], one_host_np2, "two hosts and one", atol_scale=1e-6)
    assert [int(x["epoch"]) for x in read_metrics(tmp_path / "ck")] == [1, 2]
