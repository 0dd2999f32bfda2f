"""Where a search keeps its study (sweeps/store.py): the journal file never lets a second writer
in, however long a lock is held; and a real PostgreSQL server (tests/servers.py), on which jobs
share a study, a trial whose group was frozen is taken up by a live group under its number once
the frozen group lets go of it, a job stopped by SIGTERM and submitted again ends with exactly
its trials, none trained twice, through a restart of the database; and a database gone for
good, or hung, ends the whole job in one line.
"""
import os
import re
import shlex
import signal
import threading
import time
import types

import psutil
import pytest

from helpers import (
    ONE_THREAD,
    PY,
    assert_ok,
    assert_one_line_error,
    common_args,
    horovod_cmd,
    metrics_rows,
    parse,
    rank_pids,
    read_metrics,
    run,
    wait_until,
)
from servers import PostgresServer, free_port
from sweeps import search, store
from training.base import safeio
from training.base.errors import UsageError
from training.run import rundir

SPACE = ["--search", "lr=0.02,0.05", "--search", "label-smoothing=0:0.2", "--ranks-per-run", 1, "--pruner", "none"]
CANARY = "canary-Pw-7d1e"  # a password that must reach no file and no line
BEAT = 3  # --heartbeat: a trial silent for 6 s is taken up; a loaded 2-core machine beats within that


@pytest.fixture(scope="module")
def postgres():
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()


def db_trials(url, folder):
    import optuna
    study = optuna.load_study(study_name=f"search {os.path.abspath(folder)}", storage=url)
    return study.get_trials()


def trained(out, number):
    """The epochs trial `number` trained in a job's output (each epoch's line of the trainer)."""
    return [int(m) for m in re.findall(rf"^trial {number} epoch (\d+)/\d+ ", out, re.M)]


def test_the_journal_never_breaks_a_lock_however_long_held(tmp_path):
    # Optuna's journal lock is broken by a writer that has waited 30 s for it: one that stalled
    # longer on a slow filesystem would have a second one append beside it. The study's lock
    # has no such grace (30 s of waiting is not spent here to show it), and a write waits on it
    # until the job that holds the study removes it.
    import optuna
    kept = store.Journal(types.SimpleNamespace(checkpoint_dir=str(tmp_path)))
    storage = kept.storage()
    assert storage._backend._lock.grace_period is None
    study = optuna.create_study(study_name=kept.name, storage=storage)
    lock = tmp_path / (store.STUDY + store.JOURNAL_LOCK)
    lock.touch()
    written = threading.Event()
    threading.Thread(target=lambda: (study.set_user_attr("x", 1), written.set()), daemon=True).start()
    assert not written.wait(2)
    lock.unlink()  # as the job that holds the study does when it starts
    assert written.wait(30) and study.user_attrs == {"x": 1}


def frozen_in_a_trial(proc, url, port, ck):
    """SIGSTOP `proc` at a moment when it holds a trial's folder (it trains that trial) and
    none of its connections to the database on `port` is in a transaction (it holds no lock
    another job would wait on while it is frozen); returns that trial's number."""
    import sqlalchemy
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    query = sqlalchemy.text("SELECT state FROM pg_stat_activity WHERE client_port = ANY(:ports)")
    try:
        for _ in range(500):
            proc.suspend()
            held = [int(p.parent.name.split("-")[1]) for p in ck.glob(f"trial-*/{rundir.HOLDER}")
                    if (safeio.holder_of(str(p)) or "").endswith(f"process {proc.pid}")]
            ports = [c.laddr.port for c in proc.net_connections("tcp") if c.raddr and c.raddr.port == port]
            with engine.connect() as connection:
                states = [row[0] for row in connection.execute(query, {"ports": ports})]
            if held and set(states) <= {"idle"}:
                return held[0]
            proc.resume()
            time.sleep(0.01)
    finally:
        engine.dispose()
    raise AssertionError(f"process {proc.pid} never held a trial out of a transaction: {states}")


def test_a_frozen_jobs_trial_is_taken_up_by_a_live_job_once_it_lets_go(data_dir, tmp_path, postgres, jobs):
    # Two jobs on the same study, as on two hosts. Job A is frozen (SIGSTOP) while it trains a
    # trial: job B takes that trial up once its heartbeat is stale, and waits for its folder.
    # A, thawed, ends its epoch there, finds the trial gone and leaves it; B goes on from A's
    # checkpoint. Both end the study: 3 trials, each epoch of each trained once.
    url = postgres.database("frozen")
    ck = tmp_path / "ck"
    args = [*common_args(data_dir, ck, epochs=3), *SPACE, "--trials", 3, "--storage", url, "--heartbeat", BEAT]
    a = jobs(horovod_cmd(1, args, script="main_sweep.py"), env_extra=ONE_THREAD)
    wait_until(lambda: re.search(r"^trial \d+ starts", a.output(), re.M), 120, "job A's first trial", a)
    b = jobs(horovod_cmd(1, args, script="main_sweep.py"), env_extra=ONE_THREAD)
    ranks = [p for p in psutil.Process(a.proc.pid).children(recursive=True) if "main_sweep.py" in " ".join(p.cmdline())]
    assert len(ranks) == 1, ranks
    number = frozen_in_a_trial(ranks[0], url, postgres.port, ck)
    try:
        assert db_trials(url, ck)[number].state.name == "RUNNING"
        wait_until(lambda: re.search(rf"^trial {number}: its folder is held by .*process {ranks[0].pid}\b.*waiting",
                                     b.output(), re.M), 120, f"job B taking trial {number} up", b)
    finally:
        ranks[0].resume()
    assert b.wait(timeout=300) == 0, b.output()[-4000:]
    assert a.wait(timeout=120) == 0, a.output()[-4000:]
    out_a, out_b = a.output(), b.output()
    assert re.search(rf"^trial {number} resumes", out_b, re.M) and "Warning" not in out_b, out_b[-3000:]
    assert re.search(rf"^trial {number} was taken up by another group", out_a, re.M), out_a[-3000:]
    got = db_trials(url, ck)
    assert [t.number for t in got] == [0, 1, 2] and {t.state.name for t in got} == {"COMPLETE"}, got
    for t in got:
        assert [int(r["epoch"]) for r in read_metrics(ck / f"trial-{t.number}")] == [1, 2, 3]
        assert sorted(trained(out_a, t.number) + trained(out_b, t.number)) == [1, 2, 3], t.number
    assert f"study {url}: 3 trials, 3 complete" in out_b
    # A trial asked for whose process died before it claimed it (no heartbeat at all): the next
    # job takes it up.
    import optuna
    study = optuna.load_study(study_name=f"search {os.path.abspath(ck)}", storage=url)
    study.ask(search.distributions(parse(*args, port="sweep").search))
    more = [*args[:args.index("--trials") + 1], 4, *args[args.index("--trials") + 2:]]
    r = assert_ok(run(horovod_cmd(1, more, script="main_sweep.py"), timeout=120, env_extra=ONE_THREAD))
    assert re.search(r"^trial 3 resumes", r.stdout, re.M), r.stdout[-2000:]
    assert [t.state.name for t in db_trials(url, ck)] == ["COMPLETE"] * 4
    # A job with another --heartbeat would find live trials stale, or wait too long for lost ones.
    other = [*args[:-1], BEAT + 2]
    r = run(horovod_cmd(1, other, script="main_sweep.py"), timeout=120, env_extra=ONE_THREAD)
    assert_one_line_error(r, f"has its trials' heartbeat every {BEAT} s, not {BEAT + 2}: give --heartbeat {BEAT}",
                          code=2)


def secrets_in(folder, *texts):
    """The files under `folder`, and the texts, that hold CANARY."""
    found = [f"{p}" for p in folder.rglob("*") if p.is_file() and CANARY.encode() in p.read_bytes()]
    return found + [t[max(0, t.find(CANARY) - 200):t.find(CANARY) + 50] for t in texts if CANARY in t]


def test_a_stopped_job_submitted_again_ends_with_its_six_trials_none_trained_twice(data_dir, tmp_path, postgres, jobs):
    # The study's URL carries a password (the server trusts 127.0.0.1 and ignores it), and the
    # job logs to an MLflow store of its own: the password is in no file the job wrote, its
    # MLflow store included, and in no line it printed. The resubmitted job sees the database
    # restart (every connection dropped) in the middle of its trials, and goes on.
    url = postgres.database("stopped").replace("postgres@", f"postgres:{CANARY}@")
    shown = url.replace(CANARY, "***")
    ck = tmp_path / "ck"
    tracked = ["--mlflow", f"sqlite:///{tmp_path}/mlflow.db"]
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracked[1])  # its artifacts here, not in MLflow's default ./mlruns
    client.create_experiment("cifar10", artifact_location=str(tmp_path / "artifacts"))
    # A heartbeat of 10 s: the 4 s the database is down below leave every trial's beat fresh.
    args = [*common_args(data_dir, ck, epochs=2), *SPACE, "--trials", 6, "--storage", url, "--heartbeat", 10,
            *tracked]
    # The job's own run may take longer than its 15 s to make on a loaded machine: its trials'
    # runs are then not nested under it (a line says so), which this test reads.
    env = {**ONE_THREAD, "CIFAR_MLFLOW_PARENT_WAIT_S": "120"}
    job = jobs(horovod_cmd(2, args, script="main_sweep.py"), env_extra=env)
    wait_until(lambda: any(metrics_rows(ck / f"trial-{n}") for n in range(6)), 120, "a trial's first epoch", job)
    pids = rank_pids("main_sweep.py", str(ck))
    assert set(pids) == {0, 1}, pids
    for pid in pids.values():
        os.kill(pid, signal.SIGTERM)
    assert job.wait(timeout=60) != 0
    first = job.output()
    left = [t.number for t in db_trials(url, ck) if t.state.name == "RUNNING"]
    assert left, first[-3000:]
    # What the stopped job kept: an epoch's checkpoint and metrics row are saved together. Its
    # output is no record: an epoch's line goes out before its checkpoint, and mpirun may drop
    # a rank's last lines as it ends a job whose ranks exit with a failure.
    kept = {n: [int(x["epoch"]) for x in read_metrics(ck / f"trial-{n}")]
            if (ck / f"trial-{n}" / "metrics.csv").exists() else [] for n in range(6)}
    again = jobs(horovod_cmd(2, args, script="main_sweep.py"), env_extra=env)
    wait_until(lambda: re.search(r"^trial \d+ epoch 1/", again.output(), re.M), 120, "a trial's epoch", again)
    postgres.restart(down_s=4)  # a trial reports every epoch (under a second): calls meet it down
    assert again.wait(timeout=300) == 0, again.output()[-4000:]
    r = types.SimpleNamespace(stdout=again.output())
    got = db_trials(url, ck)
    assert [t.number for t in got] == list(range(6)) and {t.state.name for t in got} == {"COMPLETE"}, got
    assert {t.user_attrs["ranks"] for t in got} == {"0", "1"}  # both groups took trials
    for n in left:
        assert re.search(rf"^trial {n} resumes", r.stdout, re.M), r.stdout[-3000:]
    for n in range(6):
        assert [int(x["epoch"]) for x in read_metrics(ck / f"trial-{n}")] == [1, 2]
        assert sorted(kept[n] + trained(r.stdout, n)) == [1, 2], (n, kept[n])
    assert f"study {shown}: 6 trials, 6 complete" in r.stdout and f"optuna-dashboard {shlex.quote(shown)}" in r.stdout
    assert (ck / "search.csv").read_text().count("\n") == 7 and not (ck / "study.journal").exists()
    parent = next(x for x in client.search_runs([client.get_experiment_by_name("cifar10").experiment_id])
                  if "mlflow.parentRunId" not in x.data.tags)
    assert parent.data.params["storage"] == shown
    assert secrets_in(tmp_path, first, r.stdout) == []
    assert "the study's database does not answer" in r.stdout and "answers again" in r.stdout


def test_a_storage_that_is_not_postgresql_or_does_not_answer_is_one_line(data_dir, tmp_path):
    base = [*common_args(data_dir, tmp_path / "ck"), "--search", "lr=0.02,0.05", "--trials", "2"]
    with pytest.raises(UsageError, match=r"--storage takes a PostgreSQL URL, postgresql://USER@HOST\[:PORT\]/DB"):
        store.check_storage("sqlite:///study.db")
    with pytest.raises(UsageError, match="--storage keeps the study of a --search"):
        parse(*base[:-4], "--storage", "postgresql://h/db", port="sweep")
    r = run([PY, "main_sweep.py", *base, "--storage", f"postgresql://someone:secret@127.0.0.1:{free_port()}/study"],
            timeout=120)
    assert_one_line_error(r, "cannot reach the study's database postgresql://someone:***@127.0.0.1:", code=1)
    assert "secret" not in r.stderr + r.stdout and not (tmp_path / "ck").exists()


@pytest.mark.parametrize("fault", ["gone", "hung"])
def test_a_database_gone_for_good_or_hung_ends_every_process_of_the_job_in_one_line(
        fault, data_dir, tmp_path, postgres, jobs):
    # Two groups; the database stops for good, or hangs (every process of the server frozen:
    # calls wait on TCP, and nothing fails), in the middle of their trials, and the calls are
    # retried, or waited for, 3 s here (60 s by default). The job then ends, every process of
    # it, with the reason in one line: no group waits forever for one that met the error.
    url = postgres.database(fault)
    ck = tmp_path / "ck"
    args = [*common_args(data_dir, ck, epochs=3), *SPACE, "--trials", 4, "--storage", url, "--heartbeat", 10]
    job = jobs(horovod_cmd(2, args, script="main_sweep.py"), env_extra={**ONE_THREAD, "CIFAR_STUDY_RETRY_S": "3"})
    wait_until(lambda: re.search(r"^trial \d+ epoch 1/", job.output(), re.M), 120, "a trial's epoch", job)
    postgres.crash() if fault == "gone" else postgres.freeze()
    try:
        assert job.wait(timeout=120) != 0
    finally:
        postgres.serve() if fault == "gone" else postgres.thaw()
    out = job.output()
    why = r"\(a call hung\)" if fault == "hung" else r"\((?!a call hung)"
    said = r"^main_sweep.py: error \(rank \d\): the study's database did not answer for 3 s " + why
    assert re.search(said, out, re.M), out[-3000:]
    assert "Traceback" not in out, out[-3000:]
