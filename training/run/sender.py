"""The sender of a run's MLflow requests (tracking.py's Tracker): a thread with an inbox, so
that training never waits on the tracking server, whatever the store.

The training thread hands it rows (`put_rows`) and returns at once. The thread makes or finds
the MLflow run, sends the params the run lacks and every row it has not sent, in batches. Where
a request fails it says so in one line, keeps what it has, and tries again every RETRY_S
seconds; when the server answers again it says so and sends what it kept. `end` hands it the
run's end (files, tags, a status) and waits at most FINISH_WAIT_S (the variable
CIFAR_MLFLOW_WAIT_S where set) for all of it to reach the server; what did not is named in one
line. A pause (--stop-at short of --epochs, a search's trial between its epochs, an elastic
world replaced) waits at most PAUSE_WAIT_S, quietly: the run's next tracker sends what is left,
its sender taking over from the one before in the process.
A request waits at most MLFLOW_HTTP_REQUEST_TIMEOUT seconds (10 here unless set) and is
not retried by MLflow itself (MLFLOW_HTTP_REQUEST_MAX_RETRIES 0 unless set): the sender's own
retries take its place.

With --mlflow-log-model the run's end also logs best.pth's model, saved as an MLflow model
(tracking.save_model), as the run's artifact folder MODEL_NAME, registered once where asked;
with --mlflow-system-metrics the thread starts MLflow's monitor of the node once the run is on
the server, starts it again where it stopped (at a request that failed), and stops it at the
run's end.
"""
import os
import queue
import sys
import threading
import time

from training.base.redact import redact

METRICS = ("lr", "train_loss", "train_acc", "test_loss", "test_acc", "epoch_time_s", "train_time_s",
           "images_per_s", "world_size")  # runlog.METRICS_COLUMNS less the step
BATCH = 900  # metrics per request (MLflow takes at most 1000)
RETRY_S = 5.0  # between tries while the server does not answer
FINISH_WAIT_S = 30.0  # the longest a run's end waits for the server
PAUSE_WAIT_S = 1.0  # the longest a pause (--stop-at, an elastic reset) waits: the next run sends it
PARENT_WAIT_S = 15.0  # main_sweep.py's longest wait for its run (CIFAR_MLFLOW_PARENT_WAIT_S)
ABORT_WAIT_S = 5.0  # the longest a process ending on an error or a stop waits to mark its run
MODEL_NAME = "model"  # the artifact folder of the model --mlflow-log-model logs
LINGER_S = 300.0  # how long a sender goes on trying after its end stopped waiting for it
live = set()  # the trackers of this process not yet closed (tracking.end_unfinished)
busy = set()  # the senders whose thread is running (drain)
newest = {}  # a run folder -> the newest sender of this process for its run (Sender._succeed)


def drain(seconds):
    """Wait, at most `seconds` in all, for every sender's thread to send what it was handed (at
    the process's exit: what a closed or paused run handed last)."""
    deadline = time.monotonic() + seconds
    for s in list(busy):
        s.thread.join(max(0.0, deadline - time.monotonic()))


def finish_wait_s():
    return float(os.environ.get("CIFAR_MLFLOW_WAIT_S", FINISH_WAIT_S))


def parent_wait_s():
    return float(os.environ.get("CIFAR_MLFLOW_PARENT_WAIT_S", PARENT_WAIT_S))


def span(epochs):
    epochs = sorted(epochs)
    return f"{epochs[0]}-{epochs[-1]}" if len(epochs) > 1 else str(epochs[0])


def short(error):
    text = str(error).strip().splitlines()
    return redact((text[0] if text else type(error).__name__)[:200])


def error_code(e):
    return getattr(e, "error_code", None)


class Sender:
    """The requests of one Tracker, sent by a thread of their own (see the module)."""

    def __init__(self, tracker, run_id, world_size, history, parent, why):
        for var, value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0"),
                           ("MLFLOW_HTTP_REQUEST_TIMEOUT", "10"),
                           # MLflow's own "View run" line at every end
                           ("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "1")):
            os.environ.setdefault(var, value)
        self.tracker, self.shown = tracker, tracker.shown
        self.run_id, self.parent, self.why = run_id, parent, why
        self.world_size = world_size
        self.rows = list(history)  # every row known: all of them go to a run made anew
        # The rows to send; until `known`, some may be on the server already (a run continued,
        # or a request that failed after the server took it), and are dropped before a send.
        self.pending, self.known = list(history), run_id is None
        self.verified = False  # the run to continue was found on the server
        self.params_due, self.failing = True, False
        self.sent = set()  # epochs the server has
        self.handed = [r["epoch"] for r in history]  # epochs the tracker was given
        self.spent, self.given = 0.0, 0  # the training thread's seconds in put_rows, its rows
        self.client = None
        self.monitor, self.watch = None, True  # the system-metrics monitor; whether it may run
        self.model_due = getattr(tracker.args, "mlflow_log_model", False)
        self.inbox = queue.SimpleQueue()
        self.made = threading.Event()  # the run exists on the server
        self.lock, self.running, self.thread = threading.Lock(), False, None
        self.retired = False  # a later sender of the run took over (_succeed)
        folder = os.path.abspath(tracker.folder)
        self.before, newest[folder] = newest.get(folder), self
        # Its lines go where the run's go (a sweep's run heads each of its lines with its name),
        # also once the run has returned.
        self.out, self.err = sys.stdout, sys.stderr

    def say(self, line, error=False):
        """One line, in one write: the thread's lines may come beside the run's."""
        stream = self.err if error else self.out
        stream.write(line + "\n")
        stream.flush()

    def start(self):
        """Start the thread (the tracker does, once it holds this sender)."""
        self._put(("start", None))

    def _put(self, item):
        """An item for the thread; the thread started again where it had ended (after a pause)."""
        with self.lock:
            self.inbox.put(item)
            if not self.running:
                self.running = True
                busy.add(self)
                self.thread = threading.Thread(target=self._serve, name="mlflow sender",
                                               daemon=True)
                self.thread.start()

    def put_rows(self, rows):
        t0 = time.perf_counter()
        rows = list(rows)
        self.handed += [r["epoch"] for r in rows]
        self.given += len(rows)
        self._put(("rows", rows))
        self.spent += time.perf_counter() - t0

    def wait_for_run(self, seconds):
        self.made.wait(seconds)
        return self.run_id

    def unsent(self):
        sent = self.sent  # replaced whole by the thread, never changed in place
        return sorted({e for e in self.handed if e not in sent})

    def end(self, status, files, tags, wait_s=None):
        """Hand the end to the thread, after any end handed before it, and wait for it at most
        wait_s; say what did not reach the server."""
        done = threading.Event()
        self._put(("end", (status, list(files), dict(tags), done)))
        wait_s = finish_wait_s() if wait_s is None else wait_s
        if status is None and not tags:  # a pause: the run's next tracker sends what is left
            wait_s = min(wait_s, PAUSE_WAIT_S)
        if done.wait(wait_s):
            alone = not self.tracker.nests and not self.parent
            if status == "FINISHED" and alone and self.given:
                each = self.spent / self.given * 1e3
                self.say(f"mlflow: {self.given} epochs logged, {each:.3f} ms an epoch")
            elif status == "FINISHED" and self.tracker.nests:
                self.say(f"mlflow: the runs are nested under run {self.run_id} at {self.shown}")
            return True
        if status is None and not tags:  # paused: quiet; the thread goes on trying a while
            return False
        left = self.unsent()
        what = (f"epoch {left[0]} was not logged" if len(left) == 1 else
                f"epochs {span(left)} were not logged" if left else "the run's end was not logged")
        where = (f"; {'it is' if len(left) == 1 else 'they are'} in {self.tracker.folder}/"
                 "metrics.csv and go at the next resume" if left else "")
        self.say(f"mlflow: {what}: {self.shown} did not answer within {wait_s:g} s{where}",
                 error=True)
        return False

    # The thread.

    def _serve(self):
        if self.before is not None:
            self._succeed(self.before)
            self.before = None
        ends, give_up = [], None  # the ends handed, in order; when the thread stops trying
        while True:
            try:
                items = [self.inbox.get(timeout=RETRY_S if self.failing else None)]
            except queue.Empty:
                items = []
            while True:
                try:
                    items.append(self.inbox.get_nowait())
                except queue.Empty:
                    break
            for kind, value in items:
                if kind == "rows":
                    self.pending += value
                    self.rows += value
                elif kind == "end":
                    ends.append(value)
                    give_up = time.monotonic() + finish_wait_s() + LINGER_S
            if self.retired:  # its rows and ends are the later sender's to send
                with self.lock:
                    self.running = False
                    busy.discard(self)
                    return
            if self._sync():
                if not ends:
                    self._watch()
                while ends and self._end(*ends[0][:3]):
                    ends.pop(0)[3].set()
            finished = give_up is not None and not ends
            if finished or (give_up is not None and time.monotonic() > give_up):
                with self.lock:  # nothing handed since: the thread ends (a later item restarts it)
                    if self.inbox.empty():
                        self.running = False
                        busy.discard(self)
                        return

    def _succeed(self, before):
        """Take over from the run's earlier sender in this process (a search's trial has a
        tracker an epoch; an elastic world replaced has a new one): it stops trying once its
        request in flight has returned, and a run it made is this sender's run. Otherwise each
        sender still trying, after its tracker paused with the server down, would make a run of
        its own once the server answered."""
        with before.lock:
            before.retired = True
            thread = before.thread if before.running else None
        if thread is not None:
            before.inbox.put(("retired", None))  # wakes it from its wait between tries
            thread.join()
        if self.run_id is None and before.made.is_set():
            self.run_id, self.known = before.run_id, False  # what the server has is read first

    def _sync(self):
        """Everything kept sent; False (said once) where the server did not take it."""
        try:
            if self.client is None:
                from mlflow.tracking import MlflowClient
                self.client = MlflowClient(tracking_uri=self.tracker.uri)
            if not self.verified:
                self._open()
            if not self.known:
                history = self.client.get_metric_history(self.run_id, "test_acc")
                on_server = {m.step for m in history}
                self.sent = self.sent | on_server  # a new set: the training thread reads it
                self.known = True
            # An epoch the server has (a run continued from before a checkpoint) goes once.
            self.pending = [r for r in self.pending if r["epoch"] not in self.sent]
            if self.params_due:
                self._send_params()
            now = int(time.time() * 1000)
            from mlflow.entities import Metric
            metrics = [Metric(k, float(r[k]), now, int(r["epoch"])) for r in self.pending
                       for k in METRICS]
            for i in range(0, len(metrics), BATCH):
                self.client.log_batch(self.run_id, metrics=metrics[i:i + BATCH])
        except Exception as e:
            self._lost(e)
            return False
        self.sent = self.sent | {r["epoch"] for r in self.pending}
        if self.failing:
            epochs = [r["epoch"] for r in self.pending]
            self.say(f"mlflow: {self.shown} answers again"
                     + (f"; epochs {span(epochs)} logged" if epochs else ""))
            self.failing = False
        self.pending = []
        return True

    def _watch(self):
        """The node's system-metrics monitor running, where asked (tracking.Tracker.system_monitor):
        started, or started again where it stopped; said once where it cannot start."""
        thread = getattr(self.monitor, "_process", None)
        if not self.watch or (thread is not None and thread.is_alive()):
            return
        try:
            self.monitor = self.tracker.system_monitor(self.run_id)
        except Exception as e:
            self.say(f"mlflow: no system metrics ({short(e)})", error=True)
            self.monitor = None
        self.watch = self.monitor is not None

    def _unwatch(self):
        """The monitor stopped, what it collected sent (a request's timeout at most)."""
        self.watch = False
        monitor, self.monitor = self.monitor, None
        if monitor is not None:
            try:
                monitor.finish()
            except Exception:  # what it had not sent is lost; the run goes on to its end
                pass

    def _open(self):
        """The run to continue found, or a new one made (a run the server lacks too)."""
        if self.run_id is not None:
            try:
                run = self.client.get_run(self.run_id)
            except Exception as e:
                if error_code(e) != "RESOURCE_DOES_NOT_EXIST":
                    raise
                run = None
            if run is not None and run.info.lifecycle_stage != "deleted":
                self.verified = True
                self.made.set()
                self.tracker.named(self.run_id)
                return
            self.why = (f"mlflow: run {self.run_id} is not on {self.shown} (deleted, or another "
                        "server); logging to a new run")
            self.run_id = None
        if self.why:
            self.say(self.why, error=True)
            self.why = None
        self.run_id = self._create()
        self.verified = self.known = True
        self.pending, self.sent = list(self.rows), set()
        self.made.set()
        self.tracker.created(self.run_id)

    def _create(self):
        from mlflow.tracking.context.registry import resolve_tags
        client, args = self.client, self.tracker.args
        experiment_id = os.environ.get("MLFLOW_EXPERIMENT_ID")
        if self.parent:  # a nested run belongs to its parent's experiment
            experiment_id = client.get_run(self.parent).info.experiment_id
        if not experiment_id:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "cifar10")
            found = client.get_experiment_by_name(name)
            if found is None:
                try:
                    experiment_id = client.create_experiment(name)
                except Exception as e:  # another job made it first
                    if error_code(e) != "RESOURCE_ALREADY_EXISTS":
                        raise
                    found = client.get_experiment_by_name(name)
            experiment_id = experiment_id or found.experiment_id
        trainer = os.path.basename(sys.argv[0] or "main.py")
        tags = resolve_tags({"mlflow.source.name": trainer,
                             "checkpoint_dir": os.path.abspath(self.tracker.folder)})
        commit = self.tracker.commit()
        if commit and "mlflow.source.git.commit" not in tags:
            tags["mlflow.source.git.commit"] = commit.removesuffix("+dirty")
        if self.parent:
            tags["mlflow.parentRunId"] = self.parent
        tags = {k: redact(str(v)) for k, v in tags.items()}
        name = os.path.basename(os.path.abspath(args.checkpoint_dir))
        return client.create_run(experiment_id, tags=tags, run_name=name).info.run_id

    def _send_params(self):
        """The run's params, those it lacks: all of a new run's. A param a restart changed (--lr,
        the world size) keeps its first value, and the new one is a tag, resumed.<key>. The run
        is marked running (again)."""
        from mlflow.entities import Param, RunTag
        logged = self.client.get_run(self.run_id).data.params
        params, tags = [], []
        for k, v in self.tracker.params(self.world_size).items():
            if k not in logged:
                params.append(Param(k, v[:6000]))
            elif logged[k] != v[:6000]:
                tags.append(RunTag(f"resumed.{k}", v[:5000]))
        for i in range(0, max(len(params), len(tags)), 100):
            self.client.log_batch(self.run_id, params=params[i:i + 100], tags=tags[i:i + 100])
        self.client.update_run(self.run_id, status="RUNNING")
        self.params_due = False

    def _end(self, status, files, tags):
        """The run's files, tags and status; False (said once) where the server did not take
        them."""
        self._unwatch()
        try:
            for path in files:
                where = "checkpoint" if os.path.basename(path) == "best.pth" else None
                if os.path.isdir(path):  # best.pth's model as an MLflow model
                    self.client.log_artifacts(self.run_id, path, MODEL_NAME)
                    self._register()
                else:
                    self.client.log_artifact(self.run_id, path, where)
            for k, v in tags.items():
                self.client.set_tag(self.run_id, k, v)
            if status:
                self.client.set_terminated(self.run_id, status)
        except Exception as e:
            self._lost(e)
            return False
        return True

    def _register(self):
        """The logged model registered, once, where --mlflow-register asks (tracking.py). Where
        that fails and the server answers (a store without a model registry), it is said in one
        line and the run's end goes on; where the server does not, it is tried again."""
        if not self.model_due:
            return
        name = getattr(self.tracker.args, "mlflow_register", None)
        try:
            version = self.tracker.register(self.run_id)
        except Exception as e:
            self.client.get_run(self.run_id)  # raises where the server is the cause
            self.say(f"mlflow: the model was not registered as {name} ({short(e)})", error=True)
            version = None
        if version is not None:
            self.say(f"mlflow: model registered as {name} version {version}")
        self.model_due = False

    def _lost(self, error):
        self.known = False  # the failed request may have reached the server
        if not self.failing:
            self.say(f"mlflow: {self.shown} does not answer ({short(error)}); training goes on, "
                     "and its epochs are logged when it answers again", error=True)
        self.failing = True
