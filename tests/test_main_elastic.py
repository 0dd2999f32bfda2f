"""main_elastic.py under horovodrun's elastic driver, on localhost.

The job starts at np=3 and, once epoch 1 is in metrics.csv, loses a worker: the
discovery script reports fewer slots (a planned removal), or a worker is killed (a
failure). Either way training must go on at np=2 to the last epoch, with every
epoch in metrics.csv once; the killed worker's job logs to a real MLflow server, as one MLflow
run that each new world's rank 0 continues, each epoch once. SIGTERM to the driver ends every
worker with one line.
Every wait is bounded, and a hung job is killed.

The driver polls the discovery script about once a second and tells rank 0, which
acts at its next commit. On a busy machine that took longer than the rest of a
short run, so the removal test holds the other workers (SIGSTOP) until rank 0 says
it has heard: the run cannot end before the change reaches it, however slow the
machine. Rank 0 waits for them in an allreduce meanwhile, far below gloo's timeout.
"""
import contextlib
import os
import signal

from helpers import (
    ROOT,
    UNTIL_ENDED,
    assert_states_equal,
    common_args,
    elastic_cmd,
    is_gone,
    load_ckpt,
    metrics_rows,
    rank_pids,
    read_metrics,
    run_horovod,
    trainer_pids,
    wait_until,
    without_lr,
)
from servers import MlflowServer

EPOCHS = 6
JOB_TIMEOUT = 300  # seconds for a whole elastic job: a bound for a hung one, far above a slow one
# Small batches make an epoch take about a second at np=3 on 2 cores, so the change
# lands mid-run; the LR is low enough for LeNet not to diverge on them.
TRAIN = dict(epochs=EPOCHS, batch=8, lr=0.01)


def wait_for_epochs(job, ckpt_dir, n, timeout=180):
    return wait_until(lambda: len(metrics_rows(ckpt_dir)) >= n and metrics_rows(ckpt_dir), timeout,
                      f"epoch {n} in metrics.csv", job)


def wait_for_output(job, text, timeout):
    wait_until(lambda: text in job.output(), timeout, f"{text!r} from the job", job)


def worker_pids(ckpt_dir, hostname, ranks=None):
    """This job's main_elastic.py workers (their command line holds its ckpt_dir) that the
    driver started for `hostname` (and with one of `ranks` as their first rank), found by their
    environment. Another test's job, running beside this one, is never among them."""
    found = trainer_pids("main_elastic.py", str(ckpt_dir), HOROVOD_HOSTNAME=hostname)
    return [pid for pid, e in found.items() if ranks is None or int(e.get("HOROVOD_RANK", -1)) in ranks]


def assert_shrank_without_gaps(ckpt_dir, output):
    rows = read_metrics(ckpt_dir)
    epochs = [int(r["epoch"]) for r in rows]
    sizes = [int(r["world_size"]) for r in rows]
    assert epochs == list(range(1, EPOCHS + 1)), (epochs, output[-3000:])
    assert sizes[0] == 3 and sizes[-1] == 2, (sizes, output[-3000:])
    assert sizes == sorted(sizes, reverse=True), sizes  # 3 ... 3 2 ... 2: no flapping
    assert all(float(r["train_loss"]) == float(r["train_loss"]) for r in rows)  # no NaN
    ckpt = load_ckpt(ckpt_dir / "ckpt.pth")
    assert ckpt["epoch"] == EPOCHS and ckpt["world_size"] == 2
    assert [r["epoch"] for r in ckpt["history"]] == epochs
    assert "world size 3 -> 2" in output
    return rows


def test_slot_removal_continues_at_np2(data_dir, tmp_path, jobs):
    slots, ck = tmp_path / "slots", tmp_path / "ck"
    slots.write_text("3\n")
    job = jobs(elastic_cmd(slots, 3, 2, 3, common_args(data_dir, ck, **TRAIN)))
    wait_for_epochs(job, ck, 1)
    others = worker_pids(ck, "localhost", ranks=(1, 2))
    assert len(others) == 2, (others, job.output()[-3000:])
    for pid in others:
        os.kill(pid, signal.SIGSTOP)
    try:
        slots.write_text("2\n")  # the driver sees one slot fewer, and tells rank 0
        wait_for_output(job, "elastic: hosts removed", timeout=20)
    finally:
        for pid in others:
            with contextlib.suppress(ProcessLookupError):  # a worker that died: the checks below say so
                os.kill(pid, signal.SIGCONT)
    rc = job.wait(JOB_TIMEOUT)
    out = job.output()
    assert rc == 0, out[-4000:]
    rows = assert_shrank_without_gaps(ck, out)
    # A planned removal interrupts at a commit: the epochs before it ran at np=3 in full,
    # and the change came at the first or second commit after rank 0 heard of it.
    sizes = [int(r["world_size"]) for r in rows]
    assert sizes.index(2) in (1, 2), sizes
    assert "has been removed from elastic job" in out  # the worker whose slot went away


def test_killed_worker_rolls_back_to_last_epoch(data_dir, tmp_path, jobs):
    # One machine under two names: the driver blacklists a failed worker's whole host,
    # so the worker to kill gets a host of its own (127.0.0.1), and localhost goes on.
    slots, ck = tmp_path / "slots", tmp_path / "ck"
    slots.write_text("localhost:2\n127.0.0.1:1\n")
    # Tracked in a real MLflow server: each new world's rank 0 continues the one MLflow run.
    (tmp_path / "mlflow").mkdir()
    server = MlflowServer(tmp_path / "mlflow")
    server.start()
    try:
        # Some survivors see the dead peer only as a gloo timeout: 30 s by default, shorter
        # here, but not so short that a slow worker on a busy machine looks dead.
        job = jobs(elastic_cmd(slots, 3, 2, 3, common_args(data_dir, ck, "--mlflow", server.uri, **TRAIN),
                               gloo_timeout=15))
        wait_for_epochs(job, ck, 1)
        victims = worker_pids(ck, "127.0.0.1")
        assert len(victims) == 1, (victims, job.output()[-3000:])
        os.kill(victims[0], signal.SIGKILL)  # mid-epoch: the survivors roll back to the last commit
        rc = job.wait(JOB_TIMEOUT)
        out = job.output()
        assert rc == 0, out[-4000:]
        rows = assert_shrank_without_gaps(ck, out)
        from mlflow.tracking import MlflowClient
        client = MlflowClient(server.uri)
        (run,) = client.search_runs([client.get_experiment_by_name("cifar10").experiment_id])
        sizes = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "world_size"))
        assert sizes == [(int(r["epoch"]), float(r["world_size"])) for r in rows], sizes  # each epoch once
        assert run.info.status == "FINISHED"
    finally:
        server.stop()


def test_fixed_world_matches_main_horovod(data_dir, tmp_path, jobs):
    # With nobody leaving, the elastic trainer is main_horovod.py, bit for bit, across a
    # resume too: epoch 1, stop, then --resume (without --lr: the saved schedule goes on)
    # for epoch 2 equals main_horovod.py's 2 epochs in one go. Both in the GPU's channels_last
    # layout, where every elastic start's state sync broadcasts weights and momentum that
    # Horovod's collectives take only through ElasticState.sync's contiguous window.
    slots, el = tmp_path / "slots", tmp_path / "el"
    slots.write_text("2\n")
    for extra in (["--stop-at", 1], ["--resume"]):
        args = common_args(data_dir, el, "--channels-last", *extra)
        job = jobs(elastic_cmd(slots, 2, 2, 2, without_lr(args) if "--resume" in extra else args))
        rc = job.wait(JOB_TIMEOUT)
        assert rc == 0, job.output()[-4000:]
    r = run_horovod(2, common_args(data_dir, tmp_path / "hv", "--channels-last"), timeout=JOB_TIMEOUT)
    assert r.returncode == 0, r.stderr[-3000:]
    mine, ref = load_ckpt(el / "ckpt.pth"), load_ckpt(tmp_path / "hv" / "ckpt.pth")
    assert mine.keys() == ref.keys()  # the same checkpoint format: main.py and main_horovod.py resume it
    assert_states_equal(mine["model"], ref["model"], "main_elastic.py and main_horovod.py")
    assert mine["optimizer"]["state"].keys() == ref["optimizer"]["state"].keys()
    for i, s in ref["optimizer"]["state"].items():  # the fresh optimizer's sync left no trace
        assert_states_equal(mine["optimizer"]["state"][i], s, f"momentum of parameter {i}")
    assert mine["schedule"] == ref["schedule"]
    rows = read_metrics(el)
    assert [(r["epoch"], r["world_size"]) for r in rows] == [("1", "2"), ("2", "2")]
    assert [r["lr"] for r in rows] == [r["lr"] for r in read_metrics(tmp_path / "hv")]


def test_preflight_error_stops_every_worker(data_dir, tmp_path, jobs):
    # Rank 0 alone checks; its error reaches the others through the first state sync.
    slots, ck = tmp_path / "slots", tmp_path / "ck"
    slots.write_text("2\n")
    ck.mkdir()
    (ck / "ckpt.pth").write_bytes(b"not a checkpoint")
    job = jobs(elastic_cmd(slots, 2, 2, 2, common_args(data_dir, ck)))
    rc = job.wait(JOB_TIMEOUT)
    out = job.output()
    assert rc != 0
    errors = [ln for ln in out.splitlines() if "main_elastic.py: error" in ln]
    assert len(errors) == 1 and "already exists" in errors[0], out[-3000:]
    assert (ck / "ckpt.pth").read_bytes() == b"not a checkpoint"


def test_sigterm_to_the_driver_ends_every_worker_and_the_resume_works(data_dir, tmp_path, jobs):
    # As a scheduler ends an elastic job: SIGTERM to horovodrun, which passes it on.
    slots, ck = tmp_path / "slots", tmp_path / "ck"
    slots.write_text("2\n")
    job = jobs(elastic_cmd(slots, 2, 1, 2, common_args(data_dir, ck, "--warmup-epochs", 0,
                                                       epochs=UNTIL_ENDED)))
    wait_for_epochs(job, ck, 2, timeout=JOB_TIMEOUT)
    pids = rank_pids("main_elastic.py", str(ck))
    assert set(pids) == {0, 1}, pids
    job.signal(signal.SIGTERM)
    rc = job.wait(30)  # fails the test if a worker or the driver is still running
    out = job.output()
    # Not rc != 0: horovodrun's launcher can read a terminated worker's status as 0 (two threads
    # wait on its shell; see docs/DESIGN.md, SIGTERM), so each worker's own line is checked.
    assert all(is_gone(pid) for pid in pids.values()), (rc, out[-3000:])
    # Each worker ends with our one line, except that a worker still blocked in a collective
    # when its peer has already gone cannot run its handler (Python runs it between bytecodes,
    # not inside gloo's wait), and Horovod's elastic runtime ends it first: a C++ thread aborts
    # it with "has been removed from elastic job", or the driver, after its 5 s grace period,
    # kills it (status 137). Both were seen on a loaded machine. Neither prints a Python
    # traceback, and the checkpoint is whole either way.
    line = "main_elastic.py: interrupted (rank {}) by SIGTERM; the last finished epoch is in the checkpoint"
    ours = {r: out.count(f"[{r}]<stderr>:" + line.format(r)) for r in (0, 1)}
    ended_by_horovod = {r: f"[{r}]<stderr>:  what():  localhost[{r}] has been removed from elastic job" in out
                        or f"Process {r} exit with status code 137." in out for r in (0, 1)}
    assert all(ours[r] == 1 or (ours[r] == 0 and ended_by_horovod[r]) for r in (0, 1)), out[-3000:]
    assert sum(ours.values()) >= 1 and out.count("main_elastic.py: ") == sum(ours.values()), out[-3000:]
    assert "]<stderr>:Traceback" not in out, out[-3000:]  # horovodrun's own traceback has no prefix
    done = load_ckpt(ck / "ckpt.pth")["epoch"]
    # A stop signal waits until the epoch's checkpoint and metrics row are both saved; only a
    # rank 0 that Horovod ended may leave its last row unwritten (the resume rewrites it).
    rows = len(read_metrics(ck))
    assert done >= 2 and (rows == done or (ended_by_horovod[0] and rows == done - 1)), (done, rows)
    r = run_horovod(1, without_lr(common_args(data_dir, ck, "--resume", "--warmup-epochs", 0,
                                              "--stop-at", done + 1, epochs=UNTIL_ENDED)), "python")
    assert r.returncode == 0, r.stderr[-2000:]
    assert [int(x["epoch"]) for x in read_metrics(ck)] == list(range(1, done + 2))


def epoch_loop(script):
    """The script's lines from its epoch loop's `for` through the loop's `log.write()`, and the
    lines above that `for` (where a comment on the loop's first line stands)."""
    lines = open(os.path.join(ROOT, script)).read().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("for epoch in range("))
    end = next(i for i in range(start, len(lines)) if lines[i].strip().startswith("log.write()"))
    return lines[:start], lines[start:end + 1], lines[end + 1:]


def test_the_elastic_loop_is_main_pys_loop():
    # main_elastic.py's epochs are main.py's loop: each line it changes says why on an
    # "# Elastic:" line at most three lines above, and the epoch is committed right after it.
    import difflib
    _, plain, _ = epoch_loop("main.py")
    before, elastic, after = epoch_loop("main_elastic.py")
    changed = 0
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, plain, elastic, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        changed += (i2 - i1) + (j2 - j1)
        for j in range(j1, max(j2, j1 + 1)):  # a line taken out: the line in its place
            above = (before + elastic)[len(before) + j - 3:len(before) + j + 1]
            assert any(ln.lstrip().startswith("# Elastic:") for ln in above), (plain[i1:i2], elastic[j1:j2])
    assert changed <= 10, changed
    assert "state.commit()" in [ln.strip() for ln in after[:8]]
