"""--mlflow against a real MLflow tracking server (`mlflow server`, a SQLite store in a temporary
folder, on 127.0.0.1), read back with MlflowClient: a Horovod np=2 run is one MLflow run with
its flags and every epoch, best.pth's model (registered, with its signature, loaded back and run)
and its node's system/... metrics; a run stopped by SIGTERM and continued by --auto-resume stays
that run, each epoch logged once; a server down at the start or frozen mid-run (system metrics
on) holds no epoch back, and what it missed reaches it once; a run killed before its first
checkpoint is continued, one stopped is KILLED, one deleted on the server replaced; a bad URI,
or MLflow missing, is one line before any training. Runs nested under main_sweep.py's run are
test_search.py's. The tests share one server and run on one worker (conftest.ONE_WORKER)."""
import os
import re
import signal
import socket
import time

import pytest
import torch

from helpers import (
    PY,
    assert_ok,
    assert_one_line_error,
    common_args,
    load_ckpt,
    parse,
    read_metrics,
    run_horovod,
    run_main,
    skip_or_fail,
    wait_until,
)
import models
from servers import Gate, MlflowServer
from training.base.errors import UsageError
from training.run import tracking

try:
    import mlflow.pytorch
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


def test_a_horovod_run_is_one_mlflow_run_with_its_flags_every_epoch_its_model_and_its_node(
        server, data_dir, tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    args = common_args(data_dir, ckpt, "--mlflow", server.uri, "--mlflow-log-model", "--mlflow-register",
                       "cifar-lenet", "--mlflow-system-metrics")
    r = assert_ok(run_horovod(2, args, env_extra={"MLFLOW_EXPERIMENT_NAME": "np2",
                                                  "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "0.2"}))
    assert "mlflow: model registered as cifar-lenet version 1" in r.stdout, r.stdout + r.stderr
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
    assert {"metrics.csv", "curves.svg", "checkpoint", "model"} <= files, files
    assert run_.info.status == "FINISHED"
    want = {"mlflow_run_id": run_.info.run_id, "tracking_uri": server.uri}
    assert load_ckpt(ckpt / "ckpt.pth")["tracking"] == tracking.read_run_file(ckpt) == want
    tags = run_.data.tags  # MLflow's own context: who ran it, from which script and commit
    assert tags["mlflow.user"] and tags["mlflow.source.name"] == "main_horovod.py"
    assert tags["mlflow.source.git.commit"] == params["git_commit"].removesuffix("+dirty")
    assert params["recipe.lr"] == "0.05"
    # best.pth's model: registered, its signature a CIFAR batch of any size, and it loads and runs
    # as best.pth's weights do.
    (version,) = client.search_model_versions("name='cifar-lenet'")
    assert version.run_id == run_.info.run_id and version.status == "READY"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    info = mlflow.models.get_model_info("models:/cifar-lenet/1")
    (given,), (out,) = info.signature.inputs.inputs, info.signature.outputs.inputs
    assert (given.shape, str(given.type), out.shape) == ((-1, 3, 32, 32), "float32", (-1, 10))
    model = mlflow.pytorch.load_model("models:/cifar-lenet/1")
    same = models.get_model("lenet")
    same.load_state_dict(load_ckpt(ckpt / "best.pth")["model"])
    x = torch.randn(3, 3, 32, 32)
    assert torch.allclose(model(x), same.eval()(x), atol=1e-5)
    # The node's metrics, named after its host: rank 0's node (both ranks run on this one).
    node = socket.gethostname().split(".")[0]
    system = {k.split("/")[1] for k in run_.data.metrics if k.startswith("system/")}
    assert system == {node} and f"system/{node}/cpu_utilization_percentage" in run_.data.metrics


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


def freeze(server):
    os.killpg(server.proc.pid, signal.SIGSTOP)


def thaw(server):
    os.killpg(server.proc.pid, signal.SIGCONT)


def test_a_server_down_at_the_start_or_frozen_mid_run_holds_no_epoch_back_and_gets_each_epoch_once(
        server, data_dir, tmp_path, jobs, request):
    # 1. The server is down as the run starts (the Gate the run logs through is closed): it
    # trains anyway, says so, and names the epochs it could not log. 2. The server is back: the
    # run, resumed, makes its MLflow run and sends the epochs it missed; the server is then
    # frozen (SIGSTOP) after epoch 3 of 12, and the epochs after it are not held back (each
    # request would wait up to its 20 s timeout on the training path). 3. Thawed: the next resume
    # sends what the frozen server missed, and every epoch is in the one MLflow run exactly once.
    ckpt = tmp_path / "ckpt"
    # --mlflow-system-metrics throughout: the monitor's requests wait on the frozen server too.
    env = {"MLFLOW_EXPERIMENT_NAME": "frozen", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20", "CIFAR_MLFLOW_WAIT_S": "2",
           "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "0.2"}
    gate = Gate(server.port)
    request.addfinalizer(gate.close)
    on = ("--mlflow", f"http://127.0.0.1:{gate.port}", "--mlflow-system-metrics")
    down = run_main(common_args(data_dir, ckpt, *on, epochs=1), env_extra=env)
    assert_ok(down)
    assert "does not answer" in down.stderr and "epoch 1 was not logged" in down.stderr, down.stderr
    assert not (ckpt / tracking.RUN_FILE).exists() and load_ckpt(ckpt / "ckpt.pth")["tracking"] is None
    gate.open()
    job = jobs([PY, "main.py", *common_args(data_dir, ckpt, *on, "--auto-resume", epochs=12)], env)
    run_id = wait_until(lambda: tracking.read_run_file(ckpt), 120, "the MLflow run", job)["mlflow_run_id"]
    client = MlflowClient(server.uri)
    seen = wait_until(lambda: max(steps(client, run_id), default=0) >= 3 and steps(client, run_id), 120,
                      "epoch 3 in MLflow", job, interval=0.05)
    freeze(server)
    try:
        frozen_at = time.monotonic()
        assert job.wait(120) == 0, job.output()
        after = time.monotonic() - frozen_at
        out = job.output()
        left = 12 - max(seen)
        assert left >= 1, "the run had logged every epoch before the server froze"
        # Each epoch after the freeze would have waited a request's 20 s timeout on the training
        # path; here they take what they took before (LeNet, 500 images: under a second), and
        # the end waits its 2 s.
        assert after < 5 + 5 * left, (after, left, out[-3000:])
        assert re.search(r"epochs? [\d-]*12 (were|was) not logged", out), out[-3000:]
    finally:
        thaw(server)
    assert_ok(run_main(common_args(data_dir, ckpt, *on, "--auto-resume", epochs=13), env_extra=env))
    _, runs = runs_of(server.uri, "frozen")
    assert [r.info.run_id for r in runs] == [run_id]
    for key in ("test_acc", "lr"):
        assert steps(client, run_id, key) == list(range(1, 14)), key  # each epoch once
    assert runs[0].info.status == "FINISHED"


def test_the_run_folder_names_the_run_so_a_crash_before_the_first_checkpoint_continues_it(server, data_dir,
                                                                                         tmp_path, jobs):
    # Killed (SIGKILL) once its MLflow run exists, its checkpoint and metrics.csv removed (as a
    # crash before the first checkpoint leaves the folder), the run started again continues that
    # MLflow run; a run ended by SIGTERM is KILLED, not left RUNNING; and a run the server no
    # longer has gets a new one, said in a line.
    ckpt, env = tmp_path / "ckpt", {"MLFLOW_EXPERIMENT_NAME": "crashed"}
    job = jobs([PY, "main.py", *common_args(data_dir, ckpt, "--mlflow", server.uri, epochs=40)], env)
    first = wait_until(lambda: tracking.read_run_file(ckpt), 120, "the MLflow run", job)["mlflow_run_id"]
    job.kill()
    for name in ("ckpt.pth", "best.pth", "metrics.csv"):
        (ckpt / name).unlink(missing_ok=True)
    job = jobs([PY, "main.py", *common_args(data_dir, ckpt, "--mlflow", server.uri, epochs=40)], env)
    wait_until(lambda: "epoch 1/40" in job.output(), 120, "the first epoch", job)
    job.signal(signal.SIGTERM)
    assert job.wait(60) != 0
    client, runs = runs_of(server.uri, "crashed")
    assert [r.info.run_id for r in runs] == [first] and runs[0].info.status == "KILLED", runs
    client.delete_run(first)
    r = assert_ok(run_main(common_args(data_dir, ckpt, "--mlflow", server.uri, "--auto-resume", epochs=2),
                           env_extra=env))
    assert f"run {first} is not on {server.uri}" in r.stderr, r.stderr
    _, runs = runs_of(server.uri, "crashed")
    assert len(runs) == 1 and runs[0].info.run_id != first and steps(client, runs[0].info.run_id) == [1, 2]


def test_a_bad_uri_is_one_line_before_any_training_and_says_no_secret(client_side, data_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    with pytest.raises(UsageError, match=r"--mlflow ftp://me:\*\*\*@example.org/x: not a tracking URI"):
        parse(*common_args(data_dir, ckpt, "--mlflow", "ftp://me:CANARY@example.org/x"))
    with pytest.raises(UsageError, match="--mlflow-log-model logs to MLflow: add --mlflow URI"):
        parse(*common_args(data_dir, ckpt, "--mlflow-log-model"))
    with pytest.raises(UsageError, match="--mlflow-system-metrics logs to MLflow: add --mlflow URI"):
        parse(*common_args(data_dir, ckpt, "--mlflow-system-metrics"))
    with pytest.raises(UsageError, match="--mlflow-register registers the model --mlflow-log-model logs"):
        parse(*common_args(data_dir, ckpt, "--mlflow", "http://127.0.0.1:5000", "--mlflow-register", "m"))
    r = run_main([*common_args(data_dir, ckpt, "--mlflow", "gopher://me:CANARY@h/x")])
    assert_one_line_error(r, "--mlflow gopher://me:***@h/x: not a tracking URI", code=2)
    assert "CANARY" not in r.stdout + r.stderr


def test_without_mlflow_the_flag_names_the_install(monkeypatch, tmp_path):
    real = tracking.importlib.util.find_spec
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name: None if name == "mlflow" else real(name))
    with pytest.raises(UsageError, match="--mlflow needs MLflow, which is not installed here: pip install mlflow"):
        parse(*common_args(tmp_path, tmp_path, "--mlflow", "http://127.0.0.1:5000"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")  # the variable alone turns it on
    with pytest.raises(UsageError, match="not installed"):
        parse(*common_args(tmp_path, tmp_path))
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name: None if name == "psutil" else real(name))
    with pytest.raises(UsageError, match="--mlflow-system-metrics needs psutil, which is not installed here: pip"):
        parse(*common_args(tmp_path, tmp_path, "--mlflow-system-metrics"))
