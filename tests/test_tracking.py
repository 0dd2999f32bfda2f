"""--mlflow against a real MLflow tracking server (`mlflow server`, a SQLite store in a temporary
folder, on 127.0.0.1), read back with MlflowClient: a Horovod np=2 run is one MLflow run with
its flags and every epoch; a run stopped by SIGTERM and continued by --auto-resume stays that
run, each epoch logged once; a server that stops answering stops no training, and what it missed
reaches it when it answers again; a bad URI, or MLflow missing, is one line before any training.
The tests share one server and run on one worker (conftest.ONE_WORKER)."""
import signal

import pytest

from helpers import (
    PY,
    assert_ok,
    assert_one_line_error,
    common_args,
    horovod_cmd,
    load_ckpt,
    parse,
    read_metrics,
    run,
    run_horovod,
    run_main,
    skip_or_fail,
    wait_until,
)
from servers import MlflowServer, free_port
from training.base.errors import UsageError
from training.run import tracking

try:
    from mlflow.tracking import MlflowClient
except ImportError:  # make setup installs it (requirements.txt); without it these tests skip
    MlflowClient = None


@pytest.fixture
def client_side():
    if MlflowClient is None:
        skip_or_fail("MLflow is not installed here: make setup installs it (requirements.txt)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if MlflowClient is None:
        skip_or_fail("MLflow is not installed here: make setup installs it (requirements.txt)")
    s = MlflowServer(tmp_path_factory.mktemp("mlflow"))
    s.start()
    yield s
    s.stop()


def runs_of(uri, experiment):
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    return client, (client.search_runs([found.experiment_id]) if found else [])


def steps(client, run_id, key="test_acc"):
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def test_a_horovod_run_is_one_mlflow_run_with_its_flags_and_every_epoch(server, data_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = common_args(data_dir, ckpt, "--mlflow", server.uri, "--mlflow-log-model")
    assert_ok(run_horovod(2, args, env_extra={"MLFLOW_EXPERIMENT_NAME": "np2"}))
    client, runs = runs_of(server.uri, "np2")
    assert len(runs) == 1, [r.info.run_id for r in runs]  # rank 0 alone logs
    run_ = runs[0]
    params = run_.data.params
    assert params["lr"] == "0.05" and params["world_size"] == "2" and params["trainer"] == "main_horovod.py"
    assert params["recipe.momentum"] == "0.9" and params["recipe.epochs"] == "2" and len(params["git_commit"]) >= 40
    rows = read_metrics(ckpt)
    for key in ("test_acc", "train_loss", "lr", "images_per_s"):
        got = sorted((m.step, m.value) for m in client.get_metric_history(run_.info.run_id, key))
        assert got == [(int(r["epoch"]), pytest.approx(float(r[key]))) for r in rows], key
    files = {f.path for f in client.list_artifacts(run_.info.run_id)}
    assert {"metrics.csv", "curves.svg", "checkpoint"} <= files, files
    assert run_.info.status == "FINISHED"
    assert load_ckpt(ckpt / "ckpt.pth")["tracking"] == {"mlflow_run_id": run_.info.run_id}


def test_a_sweep_is_a_parent_run_with_each_run_nested_under_it(server, data_dir, tmp_path):
    ck = tmp_path / "sweep"
    args = common_args(data_dir, ck, "--mlflow", server.uri, "--sweep", "seed=0,1", "--ranks-per-run", 1, epochs=1)
    assert_ok(run(horovod_cmd(2, args, script="main_sweep.py"), env_extra={"MLFLOW_EXPERIMENT_NAME": "sweep"}))
    client, runs = runs_of(server.uri, "sweep")
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(runs) == 3 and len(parents) == 1, [(r.info.run_name, r.data.tags) for r in runs]
    parent = parents[0]
    children = sorted((r for r in runs if r is not parent), key=lambda r: r.data.params["seed"])
    assert [r.data.params["seed"] for r in children] == ["0", "1"]
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in children)
    assert all(steps(client, r.info.run_id) == [1] and r.info.status == "FINISHED" for r in children)
    assert parent.data.params["trainer"] == "main_sweep.py" and parent.info.status == "FINISHED"
    assert {"sweep.csv", "sweep.svg"} <= {f.path for f in client.list_artifacts(parent.info.run_id)}


def test_a_stopped_run_continues_its_mlflow_run_each_epoch_once(server, data_dir, tmp_path, jobs):
    ckpt = tmp_path / "ckpt"
    env = {"MLFLOW_EXPERIMENT_NAME": "stopped"}
    # 40 epochs asked for, so that the first epoch's line comes long before the run could end;
    # the restart asks for 3 in all.
    job = jobs([PY, "main.py", *common_args(data_dir, ckpt, "--mlflow", server.uri, "--auto-resume",
                                            epochs=40)], env)
    wait_until(lambda: "epoch 1/40" in job.output(), 120, "the first epoch", job)
    job.signal(signal.SIGTERM)
    assert job.wait(60) != 0
    assert_ok(run_main(common_args(data_dir, ckpt, "--mlflow", server.uri, "--auto-resume", epochs=3),
                       env_extra=env))
    client, runs = runs_of(server.uri, "stopped")
    assert len(runs) == 1
    run_id = runs[0].info.run_id
    assert steps(client, run_id) == [1, 2, 3] and steps(client, run_id, "lr") == [1, 2, 3]
    assert runs[0].data.params["epochs"] == "40" and runs[0].data.tags["resumed.epochs"] == "3"
    assert runs[0].info.status == "FINISHED"


def test_a_server_that_stops_answering_stops_no_training_and_gets_what_it_missed(server, data_dir, tmp_path,
                                                                                 jobs, capsys):
    # A run and a tracker in this process share the server: it stops once the run has begun,
    # the run trains to its end, and it starts again (same port, same store). The tracker then
    # sends the epochs it kept at its next epoch; the run, resumed, sends what it missed.
    t = tracking.Tracker(parse(*common_args(data_dir, tmp_path / "here", "--mlflow", server.uri)), 1, [])
    rows = [{"epoch": e, **{k: 0.1 * e for k in tracking.METRICS}} for e in (1, 2, 3, 4)]
    t.log_epochs(rows[:1])
    assert not t.pending
    ckpt, env = tmp_path / "ckpt", {"MLFLOW_EXPERIMENT_NAME": "gone"}
    # Six epochs: the server stops while the run is in its first ones, on a slow machine too.
    job = jobs([PY, "main.py", *common_args(data_dir, ckpt, "--mlflow", server.uri, epochs=6)], env)
    wait_until(lambda: runs_of(server.uri, "gone")[1], 120, "the MLflow run", job, interval=0.05)
    server.stop()  # from the run's first epoch on, nothing answers
    t.log_epochs(rows[1:2])
    t.log_epochs(rows[2:3])
    said = capsys.readouterr()
    assert said.err.count("does not answer") == 1 and [r["epoch"] for r in t.pending] == [2, 3], said
    assert job.wait(120) == 0, job.output()
    out = job.output()
    assert "does not answer" in out and "were not logged" in out and "metrics.csv" in out, out
    # The run resumed while the server is still down (its tracker, in this process): it cannot
    # ask which epochs the server has, keeps all six, and sends only the missing ones.
    saved = load_ckpt(ckpt / "ckpt.pth")
    resumed = tracking.Tracker(parse(*common_args(data_dir, ckpt, "--mlflow", server.uri, epochs=7)), 1,
                               saved["history"], state=saved["tracking"])
    assert [r["epoch"] for r in resumed.pending] == [1, 2, 3, 4, 5, 6]
    server.start()
    t.log_epochs(rows[3:])
    assert "answers again; epochs 2-4 logged" in capsys.readouterr().out and not t.pending
    client = MlflowClient(server.uri)
    assert steps(client, t.run_id) == [1, 2, 3, 4]
    assert resumed.flush() and steps(client, resumed.run_id) == [1, 2, 3, 4, 5, 6]
    assert_ok(run_main(common_args(data_dir, ckpt, "--mlflow", server.uri, "--auto-resume", epochs=7),
                       env_extra=env))
    client, runs = runs_of(server.uri, "gone")
    assert len(runs) == 1 and steps(client, runs[0].info.run_id) == [1, 2, 3, 4, 5, 6, 7]


def test_a_bad_uri_is_one_line_before_any_training(client_side, data_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    r = run_main(common_args(data_dir, ckpt, "--mlflow", f"http://127.0.0.1:{free_port()}"))
    assert_one_line_error(r, "no MLflow tracking server answers", code=2)
    assert not (ckpt / "ckpt.pth").exists() and "epoch 1/" not in r.stdout
    with pytest.raises(UsageError, match="--mlflow ftp://example.org/x: not a tracking URI"):
        parse(*common_args(data_dir, ckpt, "--mlflow", "ftp://example.org/x"))
    with pytest.raises(UsageError, match="--mlflow-log-model logs to MLflow: add --mlflow URI"):
        parse(*common_args(data_dir, ckpt, "--mlflow-log-model"))


def test_without_mlflow_the_flag_names_the_install(monkeypatch, tmp_path):
    real = tracking.importlib.util.find_spec
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name: None if name == "mlflow" else real(name))
    with pytest.raises(UsageError, match="--mlflow needs MLflow, which is not installed here: pip install mlflow"):
        parse(*common_args(tmp_path, tmp_path, "--mlflow", "http://127.0.0.1:5000"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")  # the variable alone turns it on
    with pytest.raises(UsageError, match="not installed"):
        parse(*common_args(tmp_path, tmp_path))
