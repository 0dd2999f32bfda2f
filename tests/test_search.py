"""--search (search.py): an Optuna study over the groups of a real MPI job, with pruning.

One study of 6 trials on 2 single-process groups (mpirun -np 2), the median pruner and the
random sampler, over a space whose learning rates include one that diverges (1e38) and one
that learns nothing (1e-5), made once for the module: the journal holds 6 trials, each
complete, pruned (before its last epoch) or failed (with its reason), and the search went on
after a failure; its MLflow server, down while trials start and up again (a Gate in front of
it: no restart's cost decides whether the search ends first), gets each trial as one run under
the search's, ended as Optuna ended it; every line the trials print
names its trial; the command printed for the best trial retrains it alone with
main_horovod.py, bitwise the trial. A study stopped by SIGTERM and
submitted again ends with exactly its trials, none trained twice. Bad input stops in one line,
exit status 2, with nothing written. optuna-dashboard serves the study.

The draws of the seeded random sampler are Optuna 5.0's (requirements.txt pins it): with --seed
0, the first group draws lr 0.05 and then 1e-5, the second 1e38 first.
"""
import json
import os
import re
import shlex
import signal
import subprocess
import types
import urllib.request

import pytest

try:
    from mlflow.tracking import MlflowClient
except ImportError:  # make setup installs it; without it the study is not tracked
    MlflowClient = None

from helpers import (
    BIN,
    ONE_THREAD,
    PY,
    ROOT,
    assert_ok,
    assert_states_equal,
    common_args,
    horovod_cmd,
    is_gone,
    load_ckpt,
    metrics_rows,
    parse,
    rank_pids,
    read_metrics,
    run,
    skip_or_fail,
    wait_until,
)
from helpers import env as env_of
from servers import Gate, MlflowServer, free_port
from sweeps import search, store
from training.base.errors import UsageError

CANARY = "canary-Tk-41f0"  # a password that must reach no file and no line
EPOCHS = 3
SPACE = ["--search", "lr=1e-5,0.05,1e38", "--search", "label-smoothing=0:0.2"]
RUN_COLS = ("epoch", "lr", "train_loss", "train_acc", "test_loss", "test_acc", "world_size")


def search_cmd(np_, args):
    return horovod_cmd(np_, args, "mpirun", script="main_sweep.py")


def trials(ck):
    """The study's trials, read from its journal as optuna-dashboard would."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    storage = JournalStorage(JournalFileBackend(str(ck / "study.journal")))
    return optuna.load_study(study_name="search", storage=storage).get_trials()


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real MLflow server the study logs to, where MLflow is installed (make setup's)."""
    if MlflowClient is None:
        yield None
        return
    server = MlflowServer(tmp_path_factory.mktemp("mlflow"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gate(mlflow_server):
    """The port the study logs to, in front of its server (a Gate), open again after the study:
    the retrain command the search prints logs there too."""
    if mlflow_server is None:
        yield None
        return
    gate = Gate(mlflow_server.port)
    gate.open()
    yield gate
    gate.close()


@pytest.fixture(scope="module")
def study(data_dir, tmp_path_factory, mlflow_server, gate):
    ck = tmp_path_factory.mktemp("search") / "ck"
    args = [*common_args(data_dir, ck, epochs=EPOCHS), *SPACE, "--trials", 6, "--ranks-per-run", 1,
            "--pruner", "median", "--sampler", "random"]
    # The tracking URI carries a password, as a server behind basic authentication needs (this
    # one ignores it): it is in no file the search wrote and in no line it printed.
    if mlflow_server is None:
        return ck, args, run(search_cmd(2, args), timeout=300, env_extra=ONE_THREAD)
    tracked = ["--mlflow", f"http://tracker:{CANARY}@127.0.0.1:{gate.port}"]
    return ck, args, searched_with_the_server_down_a_while(search_cmd(2, [*args, *tracked]), mlflow_server, gate,
                                                           ck.parent)


def searched_with_the_server_down_a_while(cmd, server, gate, folder):
    """The search `cmd`, logging through `gate`, run with the gate closed once the search's own
    run is on `server`, and open again once two trials have started without it (they train
    anyway, and make their runs when it answers): its result as run() gives it, with .down, the
    trials that started while down."""
    # A trial's end waits 2 s for the server, not 30: it is sent once the server answers.
    env = env_of(dict(ONE_THREAD, MLFLOW_EXPERIMENT_NAME="study", CIFAR_MLFLOW_WAIT_S="2"))
    with open(folder / "out", "w") as out, open(folder / "err", "w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    started = lambda: set(re.findall(r"^trial (\d+) starts", (folder / "out").read_text(), re.M))  # noqa: E731

    def started_down():  # the trials started since `before`, once two have, one saying so
        new, said = started() - before, (folder / "out").read_text() + (folder / "err").read_text()
        return len(new) >= 2 and any(re.search(rf"^trial {n} mlflow: .* does not answer", said, re.M) for n in new)
    client = MlflowClient(server.uri)
    try:
        wait_until(lambda: proc.poll() is not None or client.search_runs(
            [e.experiment_id for e in client.search_experiments() if e.name == "study"]), 120, "the search's run")
        before = started()
        gate.close()
        try:
            wait_until(lambda: proc.poll() is not None or started_down(), 120, "two trials without the server")
            down = started() - before
        finally:
            gate.open()
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return types.SimpleNamespace(returncode=proc.returncode, stdout=(folder / "out").read_text(),
                                 stderr=(folder / "err").read_text(), down=down)


def test_six_trials_on_two_groups_each_complete_pruned_or_failed(study):
    ck, _, r = study
    assert_ok(r)
    got = trials(ck)
    states = {t.number: t.state.name for t in got}
    assert len(got) == 6 and set(states.values()) == {"COMPLETE", "PRUNED", "FAIL"}, states
    assert {t.user_attrs["ranks"] for t in got} == {"0", "1"}  # both groups took trials
    for t in got:
        rows = metrics_rows(ck / f"trial-{t.number}")
        epochs = [int(x["epoch"]) for x in rows]
        if t.state.name == "COMPLETE":
            assert epochs == [1, 2, 3] and t.value == float(rows[-1]["test_acc"])
        elif t.state.name == "PRUNED":  # stopped before its last epoch, its files kept
            assert epochs == list(range(1, len(epochs) + 1)) and 1 <= len(epochs) < EPOCHS, epochs
            assert sorted(t.intermediate_values) == epochs
            assert load_ckpt(ck / f"trial-{t.number}" / "ckpt.pth")["epoch"] == len(epochs)
        else:  # diverged in its first epoch: failed, with its reason, nothing saved
            assert t.params["lr"] == "1e38" and epochs == []
            assert t.user_attrs["fail_reason"].startswith("epoch 1: training diverged in epoch 1: "), t.user_attrs
    first_failed = min(n for n, s in states.items() if s == "FAIL")
    assert any(s != "FAIL" for n, s in states.items() if n > first_failed), states  # the search went on
    summary = {row.split(",")[0]: row.split(",")[1] for row in (ck / "search.csv").read_text().splitlines()[1:]}
    assert summary == {str(n): {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed"}[s]
                       for n, s in states.items()}
    assert (ck / "search.svg").stat().st_size > 0
    assert f"study {ck / 'study.journal'}: 6 trials" in r.stdout
    assert f"watch the study: optuna-dashboard {ck / 'study.journal'}" in r.stdout


def test_each_trial_is_an_mlflow_run_under_the_search_ended_as_optuna_ended_it(study, mlflow_server, gate):
    if mlflow_server is None:
        skip_or_fail("MLflow is not installed here: make setup installs it (requirements.txt)")
    ck, _, r = study
    assert_ok(r)
    client = MlflowClient(mlflow_server.uri)
    runs = client.search_runs([client.get_experiment_by_name("study").experiment_id])
    parent = next(x for x in runs if x.info.run_name == "ck" and "mlflow.parentRunId" not in x.data.tags)
    children = {x.info.run_name: x for x in runs if x.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    ended = {"COMPLETE": "FINISHED", "PRUNED": "KILLED", "FAIL": "FAILED"}
    assert len(children) == len(runs) - 1, sorted(x.info.run_name for x in runs)  # one run a trial
    got = {name: (x.data.tags.get("optuna.state"), x.info.status) for name, x in children.items()}
    assert got == {f"trial-{t.number}": (t.state.name, ended[t.state.name]) for t in trials(ck)}, got
    assert "search.csv" in {f.path for f in client.list_artifacts(parent.info.run_id)}
    written = [p for folder in (ck, mlflow_server.folder) for p in folder.rglob("*")
               if p.is_file() and CANARY.encode() in p.read_bytes()]
    assert written == [] and CANARY not in r.stdout + r.stderr, written
    assert f"at http://tracker:***@127.0.0.1:{gate.port}" in r.stdout
    # The trials that started while the server was down trained anyway, and each run (those too)
    # has each epoch the trial trained, once.
    assert len(r.down) >= 2, r.down
    for name, x in children.items():
        trained = [int(row["epoch"]) for row in metrics_rows(ck / name)]
        assert sorted(m.step for m in client.get_metric_history(x.info.run_id, "test_acc")) == trained, name


def test_every_line_of_the_trials_names_its_trial(study):
    # Every line before the summary, on stdout and stderr, is a trial's, or one of the search's
    # own MLflow run (the server down a while).
    _, _, r = study
    out = r.stdout.splitlines()
    trial_lines = out[:next(i for i, ln in enumerate(out) if ln.startswith("study "))] + r.stderr.splitlines()
    assert len([ln for ln in trial_lines if re.search(r" epoch \d/3 ", ln)]) >= 6
    unnamed = [ln for ln in trial_lines if not re.match(r"(main_sweep\.py: error: )?trial \d+[ :]|search mlflow: ", ln)]
    assert not unnamed, unnamed


def test_the_best_trial_retrained_alone_is_bitwise_the_trial(study):
    ck, _, r = study
    number, command = re.search(r"^retrain the best trial \((\d+)\) alone: (.*)$", r.stdout, re.M).groups()
    words = shlex.split(command)
    trial, alone = ck / f"trial-{number}", ck / f"trial-{number}-alone"
    assert words[:2] == ["python", "main_horovod.py"] and words[-2:] == ["--checkpoint-dir", str(alone)]
    assert_ok(run([PY, *words[1:]], env_extra=ONE_THREAD))
    assert_states_equal(load_ckpt(trial / "ckpt.pth")["model"], load_ckpt(alone / "ckpt.pth")["model"],
                        f"trial {number}, trained an epoch a call in its group, and alone in one run")
    assert [[x[c] for c in RUN_COLS] for x in read_metrics(trial)] == \
        [[x[c] for c in RUN_COLS] for x in read_metrics(alone)]


def test_sigterm_mid_study_then_the_same_command_ends_with_its_trials_none_trained_twice(data_dir, tmp_path, jobs):
    # Four trials of three epochs on two groups: when the first epoch of any is saved, at least
    # ten epochs are left, so the job cannot end on its own before every process has the signal.
    ck = tmp_path / "ck"
    args = [*common_args(data_dir, ck, epochs=EPOCHS), "--search", "lr=0.02,0.05", "--search",
            "label-smoothing=0:0.2", "--trials", 4, "--ranks-per-run", 1, "--pruner", "none"]
    job = jobs(search_cmd(2, args), env_extra=ONE_THREAD)
    wait_until(lambda: any(metrics_rows(ck / f"trial-{n}") for n in range(4)), 120, "a trial's first epoch", job)
    pids = rank_pids("main_sweep.py", str(ck))
    assert set(pids) == {0, 1}, pids
    for pid in pids.values():
        os.kill(pid, signal.SIGTERM)
    assert job.wait(timeout=60) != 0 and all(is_gone(pid) for pid in pids.values())
    before = {n: metrics_rows(ck / f"trial-{n}") for n in range(4)}
    left_running = [t.number for t in trials(ck) if t.state.name == "RUNNING"]
    assert left_running and any(before[n] for n in left_running), before
    stopped = (ck / "study.journal").read_bytes()
    (ck / "study.journal.lock").touch()  # as a process killed while appending leaves it
    r = assert_ok(run(search_cmd(2, args), timeout=300, env_extra=ONE_THREAD))  # the same command
    assert (ck / "study.journal.bak").read_bytes() == stopped  # kept aside as the job started
    assert not (ck / "study.journal.lock").exists()
    got = trials(ck)
    assert [t.number for t in got] == [0, 1, 2, 3] and {t.state.name for t in got} == {"COMPLETE"}
    for n in left_running:
        assert re.search(rf"^trial {n} resumes", r.stdout, re.M), r.stdout[-3000:]
    for n in range(4):  # each epoch once; those saved before the stop kept as they were, timings too
        rows = read_metrics(ck / f"trial-{n}")
        assert [int(x["epoch"]) for x in rows] == [1, 2, 3] and rows[:len(before[n])] == before[n], n
        trained = [ln for ln in r.stdout.splitlines() if re.match(rf"trial {n} epoch \d/3 ", ln)]
        assert len(trained) == EPOCHS - len(before[n]), (n, trained)
    # A study file damaged since, by a line that is not JSON or by a write cut short at its end
    # (which Optuna would read past, then append after): the job stops in one line naming the
    # copy, and writes nothing.
    whole = (ck / "study.journal").read_bytes()
    last = whole.count(b"\n") + 1
    for damaged, where in ((whole + b"{not json\n", f"line {last}: "), (whole + b'{"op_code": 4', "was cut short")):
        (ck / "study.journal").write_bytes(damaged)
        said = bad(search_cmd(2, args), code=1)
        assert f"cannot read the study {ck / 'study.journal'} (" in said and where in said and \
            f"restore it from {ck / 'study.journal.bak'} (the copy made when the last job started)" in said, said
        assert (ck / "study.journal").read_bytes() == damaged and (ck / "study.journal.bak").read_bytes() == stopped


def test_a_trial_whose_last_epoch_was_reported_but_not_told_ends_complete_without_training(data_dir, tmp_path):
    # A process killed between the report of a trial's last epoch and telling the study it is
    # complete leaves it running with every epoch saved: the next job tells it, training nothing.
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend


    ck = tmp_path / "ck"
    job = [*common_args(data_dir, ck, epochs=2), "--search", "lr=0.02:0.08", "--trials", "1", "--ranks-per-run", "1"]
    args = parse(*job, port="sweep")
    ck.mkdir()
    study = optuna.create_study(study_name="search", direction="maximize",
                                storage=JournalStorage(JournalFileBackend(str(ck / "study.journal"))))
    study.set_user_attr("space", search.space_record(args.search))
    trial = study.ask(search.distributions(args.search))
    trial.set_user_attr("folder", search.trial_folder(args, 0))
    values = search.trial_values(args.search, trial.params)
    assert_ok(run([PY, "main_horovod.py", *search.trial_argv(args, job, 0, values, 2)], env_extra=ONE_THREAD))
    saved = read_metrics(ck / "trial-0")
    for row in saved:
        trial.report(float(row["test_acc"]), int(row["epoch"]))
    r = assert_ok(run(search_cmd(1, job), timeout=300, env_extra=ONE_THREAD))
    assert "trial 0 resumes after epoch 2" in r.stdout and "nothing left to train" in r.stdout, r.stdout[-3000:]
    (told,) = trials(ck)
    assert told.state.name == "COMPLETE" and told.value == float(saved[-1]["test_acc"])
    assert read_metrics(ck / "trial-0") == saved


def bad(args, code=2):
    """A refused command: one line, the exit status, no traceback."""
    r = run(args, timeout=120)
    said = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert r.returncode == code and len(said) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-2000:])
    return said[0]


def test_bad_searches_stop_in_one_line_before_anything_is_written(data_dir, tmp_path, study, capsys):
    ck = tmp_path / "ck"
    job = [PY, "main_sweep.py", *common_args(data_dir, ck)]
    assert "--search and --sweep do not go together" in bad([*job, *SPACE, "--trials", "2", "--sweep", "seed=0,1"])
    assert not ck.exists()
    # The flags' other refusals, in process: the parser and checks the command runs first.
    for argv, said in ((["--search", "momentum=0.8:0.99", "--trials", "2"], "FLAG one of lr, weight-decay"),
                       (["--search", "lr=0.5:0.1", "--trials", "2"],
                        "lr=0.5:0.1 is not a range; give lr=LO:HI or lr=log:LO:HI"),
                       ([*SPACE, "--trials", "0"], "--trials must be positive (got 0)")):
        with pytest.raises((UsageError, SystemExit)) as refused:
            parse(*common_args(data_dir, ck), *argv, port="sweep")
        assert said in capsys.readouterr().err + str(refused.value), said
    # The module's study, with another space: refused by the job (mpirun -np 2), said once.
    done, args, _ = study
    # The job reads the study under its lock, whose file then names it: every other file as it was.
    files = {p: p.read_bytes() for p in done.rglob("*") if p.is_file() and p.name != ".study.lock"}
    other = [*args[:args.index("--search")], "--search", "lr=log:0.01:1", *args[args.index("--trials"):]]
    said = bad(search_cmd(2, other))
    assert "study.journal is a study of another search space (--search lr=1e-5,0.05,1e38 " \
           "--search label-smoothing=0:0.2)" in said, said
    assert {p: p.read_bytes() for p in done.rglob("*") if p.is_file() and p.name != ".study.lock"} == files


def test_a_search_without_optuna_installed_is_one_line_naming_the_fix(data_dir, tmp_path):
    # A set-up that found no optuna (an offline GPU machine) trains; --search says what it lacks.
    (tmp_path / "no_optuna").mkdir()
    (tmp_path / "no_optuna" / "optuna.py").write_text("raise ImportError('hidden by this test')\n")
    ck = tmp_path / "ck"
    r = run([PY, "main_sweep.py", *common_args(data_dir, ck), *SPACE, "--trials", "2"], timeout=120,
            env_extra={"PYTHONPATH": f"{tmp_path / 'no_optuna'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    said = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert said == ["main_sweep.py: error: --search needs optuna, which this environment lacks: run `make setup` "
                    "where pip reaches a package index, or `pip install optuna`"], r.stderr[-2000:]
    assert not ck.exists()


def test_optuna_dashboard_serves_the_study(study):
    ck, _, _ = study
    dashboard = os.path.join(BIN, "optuna-dashboard")
    if not os.path.exists(dashboard):  # optional: installed here where it is missing
        r = subprocess.run([PY, "-m", "pip", "install", "-q", "optuna-dashboard"], capture_output=True, text=True,
                           timeout=300)
        if r.returncode != 0:
            skip_or_fail(f"optuna-dashboard could not be installed: {r.stderr.strip().splitlines()[-1:]}")
    port = free_port()
    server = subprocess.Popen([dashboard, str(ck / "study.journal"), "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        def listed():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as f:
                    return json.load(f)["study_summaries"]
            except OSError:
                return None
        studies = wait_until(listed, 60, "the dashboard's answer")
        assert [s["study_name"] for s in studies] == ["search"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/{studies[0]['study_id']}?after=0",
                                    timeout=30) as f:
            shown = json.load(f)["trials"]
        assert sorted(t["state"] for t in shown) == sorted(t.state.name.capitalize() for t in trials(ck))
    finally:
        server.terminate()  # the one process this test started, by its handle
        server.wait(timeout=30)


def test_a_trials_flags_and_the_command_alone_hold_its_values_bit_for_bit():

    job = ["--arch", "lenet", "--lr", "0.1", "--checkpoint-dir", "ck", "--search", "lr=log:0.01:1",
           "--search=arch=lenet,vgg11", "--trials", "4", "--epochs", "3"]
    args = parse(*job, port="sweep")
    values = search.trial_values(args.search, {"lr": 0.1 + 0.2, "arch": "vgg11"})
    assert values == [("lr", "0.30000000000000004"), ("arch", "vgg11")]
    assert search.trial_argv(args, job, 7, values, 2) == [
        "--arch", "lenet", "--lr", "0.1", "--checkpoint-dir", "ck", "--epochs", "3", "--lr=0.30000000000000004",
        "--arch=vgg11", "--checkpoint-dir", os.path.join("ck", "trial-7"), "--auto-resume", "--stop-at", "2"]
    assert search.alone_argv(args, job, values, "alone") == [
        "--epochs", "3", "--lr=0.30000000000000004", "--arch=vgg11", "--checkpoint-dir", "alone"]
    assert search.space_text(search.space_record(args.search)) == "--search lr=log:0.01:1 --search arch=lenet,vgg11"


def test_a_new_trials_folder_left_by_a_trial_the_study_forgot_is_moved_aside(tmp_path, capsys):
    # A study file restored from its copy hands out a number again; that trial's folder is kept,
    # moved aside, so that the new trial starts afresh instead of resuming another's checkpoint.

    old = tmp_path / "trial-3"
    old.mkdir()
    (old / "ckpt.pth").write_bytes(b"x")
    search.keep_aside(str(old))
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("trial-3.")]
    assert not old.exists() and len(aside) == 1 and (aside[0] / "ckpt.pth").read_bytes() == b"x"
    assert f"moved to {aside[0]}" in capsys.readouterr().out
    search.keep_aside(str(tmp_path / "trial-4"))  # a folder not there: nothing to do
    assert sorted(p.name for p in tmp_path.iterdir()) == [aside[0].name]


def test_a_study_restored_from_an_earlier_copy_hands_out_no_number_twice(data_dir, tmp_path, capsys):
    # The copy holds trial 0; trials 1-3 ran after it (folders 1 and 3 remain). Opened again, the
    # study records 1-3 as failed, so the next trial asked for is number 4, and the folders keep
    # their files.
    import optuna
    ck = tmp_path / "ck"
    args = parse(*common_args(data_dir, ck), "--search", "lr=0.02,0.05", "--trials", "6", port="sweep")
    ck.mkdir()
    study = optuna.create_study(study_name="search", storage=store.Journal(args).storage(), direction="maximize")
    study.set_user_attr("space", search.space_record(args.search))
    study.add_trial(optuna.trial.create_trial(value=0.5))
    for n in (1, 3):
        (ck / f"trial-{n}").mkdir()
        (ck / f"trial-{n}" / "ckpt.pth").write_bytes(b"x")
    assert search.open_study(args) == (4, 0)
    got = optuna.load_study(study_name="search", storage=store.Journal(args).storage()).get_trials()
    assert [t.state.name for t in got] == ["COMPLETE", "FAIL", "FAIL", "FAIL"]
    assert {t.user_attrs["fail_reason"] for t in got[1:]} == {search.FORGOTTEN}
    assert (ck / "trial-3" / "ckpt.pth").read_bytes() == b"x"
    assert "holds trials 1-3, which the study file does not" in capsys.readouterr().out
    assert (ck / "study.journal.bak").exists()


def test_a_group_whose_trial_another_group_took_up_leaves_it_untold(data_dir, tmp_path, capsys):
    # Two groups' views of one study: the first takes trial 0; the second takes it up (as it does
    # once the first's heartbeat is stale). The first's next report is refused and it is told to
    # leave; the second's epoch is reported.
    ck = tmp_path / "ck"
    args = parse(*common_args(data_dir, ck, epochs=3), "--search", "lr=0.02,0.05", "--trials", "1", port="sweep")
    ck.mkdir()
    opened = search.open_study(args)
    first, second = search.Study(args, 0, opened), search.Study(args, 1, opened)
    assert first.take("0")[0] == 0
    second.live(0).set_user_attr("owner", second.owner)
    row = [{"epoch": 1, "test_acc": 0.25}]
    assert first.after_epoch(0, 1, row, [None]) == "lost"
    assert "trial 0 was taken up by another group" in capsys.readouterr().out
    assert second.study.get_trials()[0].intermediate_values == {}
    assert second.after_epoch(0, 1, row, [None]) == "train"
    assert second.study.get_trials()[0].intermediate_values == {1: 0.25}
