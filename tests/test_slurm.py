"""Under Slurm: the sbatch files of scripts/slurm/ on a real cluster made by scripts/local_slurm.sh.

The cluster's two nodes are network namespaces, each with its own hostname, link-local
address and slurmd, and a slurmctld and munged of their own; they share this machine's
filesystem as an NFS home would. Jobs are submitted with sbatch, as a user would, and
pre-empted by a real high-partition job or stopped with scancel. One cluster serves the
module, under a name, folder and network of this test run's own; it is torn down at the
end, also when a test or the set-up fails, and every job a test left is cancelled after it.

Every rank runs one thread (OMP_NUM_THREADS=1), here and in the one-host reference run
(conftest.py's one_host_np2), as in test_multihost.py: the nodes share this machine's cores,
and the comparisons are bitwise.
Without root (namespaces) the module is skipped, in one line; under CI it fails instead.
"""
import csv
import os
import re
import signal
import subprocess
import time
from typing import NamedTuple

import pytest

from helpers import (
    ABORTED,
    BIN,
    CLUSTER_EPOCHS,
    ONE_THREAD,
    PY,
    UNTIL_ENDED,
    assert_ok,
    assert_states_equal,
    common_args,
    load_ckpt,
    load_ranks,
    metrics_rows,
    probe_cmd,
    read_metrics,
    run,
    skip_or_fail,
    trainer_pids,
    wait_until,
    without_lr,
)
from slurm_cluster import Cluster, assert_nothing_left, cluster_pids, down, frozen, signalled
from training.run import launch

JOB_TIMEOUT = 300  # seconds for one job to start and train a few tiny epochs, on a busy machine
STOP_AT = 6  # where a stopped and requeued job ends by itself (see frozen() for why it is reached late)
# Slurm's states of a job that is over (a requeued job is PENDING, then RUNNING again).
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE"}


@pytest.fixture(scope="module")
def cluster(request):
    c = Cluster()
    request.addfinalizer(lambda: down(c))  # first: a failed `up` is torn down too
    c.up(2)
    return c


@pytest.fixture(autouse=True)
def no_job_left(cluster):
    """After each test, every job it submitted is over, whether it passed or not."""
    yield
    cluster.on(1, "scancel", "--user", "root")
    # A cancelled job's processes get SIGTERM, then SIGKILL after KillWait (10 s).
    wait_until(lambda: not cluster.jobs(), 90, "job queue empty after scancel", interval=0.5)


def flags(*extra, **kw):
    """common_args less --data-dir and --checkpoint-dir, which the sbatch files pass from
    DATA_DIR and CHECKPOINT_DIR."""
    args = [str(a) for a in common_args("", "", *extra, **kw)]
    for name in ("--data-dir", "--checkpoint-dir"):
        i = args.index(name)
        del args[i:i + 2]
    return args


def probe_trainer(name, out):
    """A script for the sbatch files' TRAINER: tests/probes/<name>.py with OUT_DIR put before
    the trainer's flags, so every rank also saves its final model and host to OUT_DIR."""
    probe = probe_cmd(name)[1]
    path = os.path.join(out, f"{name}_trainer.py")
    with open(path, "w") as f:
        f.write(f"import runpy, sys\nsys.argv[1:1] = [{str(out)!r}]\n"
                f"runpy.run_path({probe!r}, run_name='__main__')\n")
    return path


def submit(cluster, sbatch_file, args, data_dir, ckpt_dir, out, **env_extra):
    """sbatch scripts/slurm/<sbatch_file> in the low partition, its output in `out`."""
    e = dict(ONE_THREAD, PYTHON=PY, TORCHRUN=os.path.join(BIN, "torchrun"), DATA_DIR=str(data_dir),
             CHECKPOINT_DIR=str(ckpt_dir), **env_extra)
    return cluster.sbatch("-p", cluster.vars["LOCAL_SLURM_LOW"], f"--output={out}",
                          os.path.join("scripts", "slurm", sbatch_file), *args, env_extra=e)


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def wait_job(cluster, job, out, what, check, timeout=JOB_TIMEOUT, interval=0.2):
    """Poll check() until it returns something true; fail the test after `timeout` seconds, or
    as soon as Slurm has ended job `job` (looked at once a second) without it."""
    deadline = time.monotonic() + timeout
    next_look = 0
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if time.monotonic() >= next_look:
            next_look = time.monotonic() + 1
            info = cluster.show(job)
            if info.get("JobState") in ENDED:
                got = check()
                if got:
                    return got
                pytest.fail(f"job {job} ended ({info.get('JobState')}, exit {info.get('ExitCode')}) "
                            f"before {what}:\n{read(out)[-4000:]}")
        time.sleep(interval)
    pytest.fail(f"no {what} after {timeout}s:\n{read(out)[-4000:]}")


def wait_ended(cluster, job, out, restarts=0, timeout=JOB_TIMEOUT):
    """The job's `scontrol show job` fields once it is over after `restarts` requeues."""
    deadline, info = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        info = cluster.show(job)
        if info.get("JobState") in ENDED:
            assert int(info["Restarts"]) == restarts, (info, read(out)[-4000:])
            return info
        time.sleep(0.5)
    pytest.fail(f"job {job} still {info.get('JobState')} after {timeout}s:\n{read(out)[-4000:]}")


def assert_two_hosts(ranks, cluster):
    """Rank r ran on node r + 1, and Horovod saw two hosts of one rank each."""
    assert [r["host"] for r in ranks] == cluster.nodes
    assert [(r["size"], r["cross_size"], r["local_size"]) for r in ranks] == [(2, 2, 1)] * 2


# ---------------------------------------------------------------------------
# sbatch -N2: training across the nodes equals training on one host

@pytest.mark.parametrize("sbatch_file", ["horovod_srun.sbatch", "horovod_mpirun.sbatch"])
def test_sbatch_horovod_trains_across_nodes_bitwise(cluster, one_host_np2, data_dir, sbatch_file, tmp_path):
    # horovod_srun: srun --mpi=pmix starts the ranks, which find each other through Slurm's
    # PMIx. horovod_mpirun: mpirun reads the allocation (no hostfile, no -np) and starts its
    # daemon on node 2 with srun. The srun run gets a fresh --data-dir: each node's local
    # rank 0 (as PMIx tells it) prepares it, both at once, in one folder.
    data = tmp_path / "data" if sbatch_file == "horovod_srun.sbatch" else data_dir
    out = tmp_path / "job.out"
    job = submit(cluster, sbatch_file, flags("--stop-at", 2, epochs=CLUSTER_EPOCHS), data,
                 tmp_path / "ck", out, TRAINER=probe_trainer("rank_horovod", tmp_path))
    info = wait_ended(cluster, job, out)
    text = read(out)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), text[-4000:]
    ranks = load_ranks(tmp_path, 2)
    assert_two_hosts(ranks, cluster)
    for r, rank in enumerate(ranks):
        assert_states_equal(rank["model"], one_host_np2, f"rank {r} and the one-host run")
    assert_states_equal(load_ckpt(tmp_path / "ck" / "ckpt.pth")["model"], one_host_np2, "the checkpoint")
    assert [int(x["epoch"]) for x in read_metrics(tmp_path / "ck")] == [1, 2]
    assert re.findall(r"^job (\d+) run (\d+) on ", text, re.M) == [(str(job), "1")], text[-4000:]


def test_sbatch_srun_torchrun_ddp_across_nodes_equals_one_host(cluster, one_host_np2, data_dir, tmp_path):
    # One torchrun per node, meeting at a c10d rendezvous on node 1. main_ddp.py at np=2 equals
    # main_horovod.py at np=2 within 1e-6 (tests/test_main_ddp.py), so the Horovod reference
    # serves here too.
    out = tmp_path / "job.out"
    job = submit(cluster, "ddp_torchrun.sbatch", flags("--stop-at", 2, epochs=CLUSTER_EPOCHS),
                 data_dir, tmp_path / "ck", out, TRAINER=probe_trainer("rank_ddp", tmp_path))
    info = wait_ended(cluster, job, out)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), read(out)[-4000:]
    ranks = load_ranks(tmp_path, 2)
    assert [(r["size"], r["local_size"]) for r in ranks] == [(2, 1)] * 2
    assert sorted(r["host"] for r in ranks) == cluster.nodes  # the rendezvous orders the nodes
    for r, rank in enumerate(ranks):
        assert_states_equal(rank["model"], one_host_np2, f"rank {r} and the one-host run", atol_scale=1e-6)
    assert [int(x["epoch"]) for x in read_metrics(tmp_path / "ck")] == [1, 2]


def test_sbatch_srun_sweep_queues_three_runs_on_two_nodes(cluster, data_dir, tmp_path):
    # horovod_srun.sbatch running main_sweep.py: srun --mpi=pmix starts a rank on each node,
    # mpi4py makes a group of each, and the two groups take the three runs from the queue; the
    # third, trained after another, equals the same seed alone.
    out, ck = tmp_path / "job.out", tmp_path / "ck"
    job = submit(cluster, "horovod_srun.sbatch", flags("--sweep", "seed=0,1,2", epochs=2), data_dir, ck, out,
                 TRAINER="main_sweep.py")
    info = wait_ended(cluster, job, out)
    text = read(out)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), text[-4000:]
    with open(ck / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["run"], r["status"], r["epochs"]) for r in rows] == \
        [("seed0", "finished", "2"), ("seed1", "finished", "2"), ("seed2", "finished", "2")]
    assert {r["ranks"] for r in rows} == {"0", "1"}, rows  # each node's group trained
    alone = tmp_path / "alone"
    assert_ok(run([PY, "main_horovod.py", *common_args(data_dir, alone, "--seed", 2, epochs=2)],
                  env_extra=ONE_THREAD))
    assert_states_equal(load_ckpt(ck / "seed2" / "ckpt.pth")["model"], load_ckpt(alone / "ckpt.pth")["model"],
                        "the sweep's queued third run and the same seed alone")


# ---------------------------------------------------------------------------
# Pre-emption and the user's stop signal: every rank stops, the job requeues, resumes

class Launcher(NamedTuple):
    sbatch: str  # in scripts/slurm/
    trainer: str
    rank_var: str  # the rank in the trainer processes' environment, absent from the launcher's own


LAUNCHERS = {"srun": Launcher("horovod_srun.sbatch", "main_horovod.py", "PMIX_RANK"),
             "mpirun": Launcher("horovod_mpirun.sbatch", "main_horovod.py", "OMPI_COMM_WORLD_RANK"),
             "torchrun": Launcher("ddp_torchrun.sbatch", "main_ddp.py", "RANK")}


def trainer_ranks(launcher, marker):
    """{rank: pid} of the job's trainer processes (their command line holds `marker`)."""
    return {int(e[launcher.rank_var]): pid for pid, e in trainer_pids(launcher.trainer, marker).items()
            if launcher.rank_var in e}


def stop_and_requeue(cluster, launcher, data_dir, tmp_path, stop, reached=(0, 1)):
    """A job of `launcher`'s sbatch file in the low partition, stopped by `stop(job)` (which
    returns the signal it has Slurm send) once an epoch is in metrics.csv, then left to requeue
    and end by itself at --stop-at; `reached` are the ranks the signal reaches first-hand.
    Returns the job and its output, once it is over."""
    ck, out = tmp_path / "ck", tmp_path / "job.out"
    # Without --lr: a resume continues the saved cosine (with --lr it would restart one).
    args = without_lr(flags("--stop-at", STOP_AT, epochs=UNTIL_ENDED))
    job = submit(cluster, launcher.sbatch, args, data_dir, ck, out)

    def both_ranks():
        ranks = trainer_ranks(launcher, str(ck))
        return ranks if len(ranks) == 2 else None

    ranks = wait_job(cluster, job, out, "both ranks started", both_ranks)
    wait_job(cluster, job, out, "epoch 1 in metrics.csv", lambda: metrics_rows(ck), interval=0.02)
    pids = [ranks[r] for r in reached]
    with frozen(pids):
        t_asked = time.monotonic()
        signum = stop(job)
        wait_until(lambda: all(signalled(pid, signum) for pid in pids), 60,
                   f"{signal.Signals(signum).name} sent to ranks {reached}")
    t_signal = time.monotonic()
    wait_job(cluster, job, out, "the requeued run", lambda: f"job {job} run 2 on " in read(out))
    t_started = time.monotonic()
    wait_job(cluster, job, out, "the requeued run's first epoch",
             lambda: re.search(rf"^job {job} run 2 on .*?^epoch \d+/", read(out), re.M | re.S))
    t_epoch = time.monotonic()
    print(f"{launcher.sbatch}, {signal.Signals(signum).name}: the requeued run started {t_started - t_signal:.1f} s "
          f"after the signal and finished its first epoch {t_epoch - t_signal:.1f} s after it "
          f"({t_epoch - t_asked:.1f} s after the request)")
    info = wait_ended(cluster, job, out, restarts=1)
    text = read(out)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), text[-4000:]
    assert not ABORTED.search(text), text[-4000:]  # no process of either run ended by SIGABRT
    assert_resumed_once(job, text, ck)
    return job, text


def assert_resumed_once(job, text, ck):
    """Two runs, the second resumed where the first stopped: every epoch once, none lost."""
    # The second run saw SLURM_RESTART_COUNT=1 (the sbatch file says run 2).
    assert re.findall(r"^job (\d+) run (\d+) on ", text, re.M) == [(str(job), "1"), (str(job), "2")], text
    first, second = text.split(f"job {job} run 2 on ")
    assert len(re.findall(r"^job \d+ stopped with status \d+ at .*: requeueing$", first, re.M)) == 1, first
    # The second run resumed after the first run's last epoch, on the saved schedule, and
    # trained on from there.
    done = [int(e) for e in re.findall(r"^epoch (\d+)/", first, re.M)]
    assert done == list(range(1, len(done) + 1)) and 1 <= len(done) < STOP_AT, first
    resumed = [ln for ln in second.splitlines() if ln.startswith("resuming ")]
    assert len(resumed) == 1 and resumed[0].startswith(f"resuming {ck / 'ckpt.pth'} after epoch {len(done)},") \
        and "the saved cosine" in resumed[0], second
    assert [int(e) for e in re.findall(r"^epoch (\d+)/", second, re.M)] == \
        list(range(len(done) + 1, STOP_AT + 1)), second
    assert [int(r["epoch"]) for r in read_metrics(ck)] == list(range(1, STOP_AT + 1))
    saved = load_ckpt(ck / "ckpt.pth")
    assert saved["epoch"] == STOP_AT and [r["epoch"] for r in saved["history"]] == list(range(1, STOP_AT + 1))


def stopped_lines(text):
    """The lines in which trainer processes said why they ended."""
    return sorted(ln for ln in text.splitlines() if re.match(r"main\w*\.py: (interrupted|error)", ln))


def interrupted(trainer, name):
    return [f"{trainer}: interrupted (rank {r}) by {name}; the last finished epoch is in the checkpoint"
            for r in (0, 1)]


def assert_each_rank_stopped_once(text, trainer, name):
    """Both ranks said once why they ended, at least one by the signal; the other may have been
    reached first by its peer's leaving (Slurm signals the tasks one after another)."""
    lines, by_signal = stopped_lines(text), interrupted(trainer, name)
    by_peer = [f"{trainer}: error (rank {r}): {launch.PEER_FAILED}: " for r in (0, 1)]
    assert len(lines) == 2 and all(sum(ln == by_signal[r] or (ln.startswith(by_peer[r]) and
                                                               ln.endswith(f"({launch.PEER_HINT})"))
                                       for ln in lines) == 1 for r in (0, 1)), text
    assert any(ln in by_signal for ln in lines), text


def status_line(text):
    return re.findall(r"^job \d+ stopped with status (\d+) at .*: requeueing$", text, re.M)


# Not under torchrun: that its agent passes a stop signal on and each rank stops once is the
# user-signal test's, and its sbatch file requeues after pre-emption (PreemptTime) with the
# same shell lines as the two here.
@pytest.mark.parametrize("name", ["srun", "mpirun"])
def test_preemption_stops_the_job_requeues_and_resumes(cluster, data_dir, tmp_path, name):
    launcher, high = LAUNCHERS[name], {}

    def preempt(job):
        # An exclusive job in the high partition needs both nodes, so Slurm pre-empts the low
        # job: SIGCONT and SIGTERM to every process of its steps.
        high["job"] = cluster.sbatch("-p", cluster.vars["LOCAL_SLURM_HIGH"], "--exclusive", "-N2",
                                     f"--output={tmp_path / 'high.out'}", "--wrap", "sleep 1")
        return signal.SIGTERM

    # Under mpirun the job's only step is mpirun's daemon on node 2, with rank 1; rank 0 runs in
    # the batch step, which pre-emption does not signal.
    _, text = stop_and_requeue(cluster, launcher, data_dir, tmp_path, preempt,
                               reached=(1,) if name == "mpirun" else (0, 1))
    assert cluster.show(high["job"])["JobState"] == "COMPLETED"
    if name == "srun":  # each rank stopped cleanly, and srun returned their status, 128 + 15
        assert_each_rank_stopped_once(text, launcher.trainer, "SIGTERM")
        assert status_line(text) == ["143"]
    else:
        # The SIGTERM reaches mpirun's daemon on node 2 and rank 1 under it. Rank 1 stops
        # cleanly and says so, but its output goes through that daemon, which the SIGTERM
        # ended: the line is lost. mpirun reports the lost daemon (status 205) and ends rank 0
        # (SIGTERM, then SIGKILL), which says so, or, when it gets there first, that it found its
        # peer gone (no error of rank 1's is above, whatever the line says), or nothing. The
        # last finished epoch was saved when it ended, and the sbatch file requeues the job
        # because Slurm set its PreemptTime.
        lines = stopped_lines(text)
        assert lines == [] or (len(lines) == 1 and (lines[0] == interrupted(launcher.trainer, "SIGTERM")[0] or
                                                    lines[0].startswith(f"main_horovod.py: error (rank 0): "
                                                                        f"{launch.PEER_FAILED}: "))), text
        assert "ORTE has lost communication with a remote daemon" in text
        assert status_line(text) == ["205"]


@pytest.mark.parametrize("name", ["srun", "torchrun"])
def test_user_signal_stops_every_rank_requeues_and_resumes(cluster, data_dir, tmp_path, name):
    launcher = LAUNCHERS[name]

    def usr2(job):
        # The sbatch file's stop signal, to its shell (-b), which passes it to srun and so to
        # every rank; as with --signal=B:USR2@120 before a time limit.
        assert_ok(cluster.on(1, "scancel", "--batch", "--signal", "USR2", job))
        return signal.SIGUSR2

    _, text = stop_and_requeue(cluster, launcher, data_dir, tmp_path, usr2)
    # One line per rank, naming the signal once: under torchrun each rank gets USR2 twice,
    # from Slurm (srun signals every process of its step) and from torchrun's agent.
    assert_each_rank_stopped_once(text, launcher.trainer, "SIGUSR2")
    # srun returns the ranks' status, 128 + 12; torchrun's agent, itself signalled, ends with 1.
    # The shell's trap saw the signal, so the job is requeued all the same.
    assert status_line(text) == ["140" if name == "srun" else "1"], text[-3000:]


# ---------------------------------------------------------------------------
# One checkpoint folder, two runs on two nodes

def test_two_runs_on_two_nodes_one_folder_one_is_refused(cluster, data_dir, tmp_path, jobs):
    # Both with a schedule that cannot end before the test ends them: only the folder's lock
    # keeps them apart.
    ck = tmp_path / "ck"
    runs = {node: jobs(cluster.cmd(node, PY, "main.py", *common_args(data_dir, ck, epochs=UNTIL_ENDED)),
                       env_extra=dict(cluster.env, **ONE_THREAD)) for node in (1, 2)}
    ended = wait_until(lambda: [n for n, j in runs.items() if j.proc.poll() is not None], JOB_TIMEOUT,
                       "one of the two runs refused")
    assert len(ended) == 1, [j.output() for j in runs.values()]
    refused, holder = ended[0], 3 - ended[0]
    out = runs[refused].output()
    assert runs[refused].proc.returncode == 1 and "Traceback" not in out, out
    assert [ln for ln in out.splitlines() if "error" in ln.lower()] == [
        f"main.py: error: --checkpoint-dir {ck} is in use by another run (host {cluster.nodes[holder - 1]}, "
        f"process {runs[holder].proc.pid}); wait for it to end, or choose another --checkpoint-dir"], out
    # The other trains on alone; SIGTERM after an epoch leaves its files whole and consistent.
    wait_until(lambda: metrics_rows(ck), JOB_TIMEOUT, "epoch 1 in metrics.csv", runs[holder])
    runs[holder].signal(signal.SIGTERM)
    assert runs[holder].wait(timeout=120) == 128 + signal.SIGTERM
    said = [ln for ln in runs[holder].output().splitlines() if "interrupted" in ln]
    assert said == ["main.py: interrupted by SIGTERM; the last finished epoch is in the checkpoint"]
    saved, rows = load_ckpt(ck / "ckpt.pth"), read_metrics(ck)
    # metrics.csv is written after the checkpoint that holds its rows: a SIGTERM in between
    # leaves it one epoch behind, which a resume rewrites from the checkpoint.
    assert rows and saved["epoch"] - len(rows) in (0, 1), (saved["epoch"], len(rows))
    assert [r["epoch"] for r in saved["history"]] == list(range(1, saved["epoch"] + 1))
    for row, kept in zip(rows, saved["history"]):
        assert {k: float(v) for k, v in row.items()} == {k: float(kept[k]) for k in row}, (row, kept)
    assert saved["args"]["checkpoint_dir"] == str(ck)
    assert not [f for f in os.listdir(ck) if f.endswith(".tmp")], "a temporary file was left"


# ---------------------------------------------------------------------------
# The cluster script cleans up after itself

def test_down_ends_running_jobs_and_leaves_nothing(tmp_path):
    # What a test that fails with a job running leaves to the module's teardown.
    c = Cluster(prefix="d")
    try:
        c.up(2)
        job = c.sbatch("-N2", f"--output={tmp_path / 'job.out'}", "--wrap", "srun sleep 600")
        programs = lambda: [os.path.basename(cmd.partition(" ")[0]) for cmd in cluster_pids(c.folder).values()]  # noqa: E731
        wait_until(lambda: programs().count("sleep") == 2, 60, f"job {job}'s sleep on both nodes")
        down(c)
        assert c.script("down").returncode == 0  # again: nothing to do, no error
    finally:
        down(c)


def test_down_removes_everything_also_after_a_failed_up(tmp_path):
    c = Cluster(prefix="u")
    subprocess.run(["ip", "netns", "add", f"{c.name}-n2"], check=True)  # in node 2's way: up fails there
    try:
        r = c.script("up", "2")
        if r.returncode == 77:
            skip_or_fail(f"no cluster of network namespaces here: {r.stderr.strip()}")
        assert r.returncode != 0 and "up failed; removing what it made" in r.stderr, r.stderr
        assert_nothing_left(c)
        assert c.script("down").returncode == 0
    finally:
        down(c)
        subprocess.run(["ip", "netns", "del", f"{c.name}-n2"], capture_output=True)
