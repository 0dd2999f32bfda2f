"""MLflow tracking of a run (--mlflow URI, or MLFLOW_TRACKING_URI set): one MLflow run per
training run, written by the process that reports; the other ranks build nothing.

- **At its start** the MLflow run gets the run's flags, the recipe as the flags resolved it,
  the world size, the trainer, the git commit and Slurm's job id as params. A run that continues
  a checkpoint (--resume, --auto-resume's restarts, an elastic world after a reset) continues
  the MLflow run the checkpoint names (`state`, saved in it as "tracking"), and sends only the
  epochs the server does not have: none is logged twice.
- **Each epoch** metrics.csv's row, at step = epoch, after the checkpoint that holds it.
- **At the end** metrics.csv and curves.svg as artifacts, best.pth with --mlflow-log-model, and
  the run marked finished.
- **main_sweep.py** is an MLflow run of its own (parent_run), with each run of a sweep and each
  trial of a search nested under it; sweep.csv and sweep.svg (search.csv, search.svg) are its
  artifacts at the end. A trial's run ends as Optuna ended the trial (end_trial).
- **A server that stops answering** never stops training: the run says so in one line, keeps
  the epochs, and sends them when the server answers again, or at the end. A request waits at
  most MLFLOW_HTTP_REQUEST_TIMEOUT seconds (here 10 unless set) and is not retried.

MLflow is not a requirement of the trainer: it is imported only here, only under --mlflow.
Without it, --mlflow is one line naming the install.
"""
import importlib.util
import json
import os
import subprocess
import sys
import time

from training.base import recipe, safeio
from training.base.errors import UsageError

INSTALL = "pip install mlflow-skinny"  # the client alone; a server needs `pip install mlflow`
SCHEMES = ("http", "https", "file", "sqlite", "postgresql", "mysql", "mssql", "databricks")
METRICS = ("lr", "train_loss", "train_acc", "test_loss", "test_acc", "epoch_time_s", "train_time_s",
           "images_per_s", "world_size")  # runlog.METRICS_COLUMNS less the step
BATCH = 900  # metrics per request (MLflow takes at most 1000)
PARENT = ".mlflow-run.json"  # in main_sweep.py's CHECKPOINT_DIR: the MLflow run of the job
# Optuna's end of a trial, as the trial's MLflow run ends (FINISHED where it completed).
TRIAL_STATUS = {"COMPLETE": "FINISHED", "PRUNED": "KILLED", "FAIL": "FAILED"}
_last = {}  # the Tracker this process made last: a search's trial is marked through it


def uri_of(args):
    """The tracking URI the run logs to: --mlflow, else MLFLOW_TRACKING_URI, else None."""
    return getattr(args, "mlflow", None) or os.environ.get("MLFLOW_TRACKING_URI") or None


def check_flags(args):
    """One line, before anything runs, for a URI MLflow cannot use, MLflow not installed, or
    --mlflow-log-model without MLflow."""
    uri = uri_of(args)
    if uri is None:
        if getattr(args, "mlflow_log_model", False):
            raise UsageError("--mlflow-log-model logs to MLflow: add --mlflow URI")
        return
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower() if ":" in uri else "file"
    if scheme not in SCHEMES:
        raise UsageError(f"--mlflow {uri}: not a tracking URI MLflow takes (http://HOST:PORT, a "
                         "folder, sqlite:///FILE, postgresql://...); fix it, or drop --mlflow")
    if importlib.util.find_spec("mlflow") is None:
        raise UsageError(f"--mlflow needs MLflow, which is not installed here: {INSTALL}")


def git_commit():
    """This checkout's commit, with +dirty where files differ from it; None outside git."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        def git(*argv):
            return subprocess.run(["git", "-C", root, *argv], capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        head, dirty = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) or None


def params_of(args, world_size):
    """Every flag, the recipe as resolved (recipe.<key>: the flag's value where there is one),
    the world size, the trainer, the git commit and Slurm's job id: as MLflow params (text)."""
    out = {k: str(v) for k, v in sorted(vars(args).items()) if not k.startswith("mlflow")}
    for key, value in recipe.of(args).items():
        out[f"recipe.{key}"] = str(getattr(args, key, value))
    out["world_size"] = str(world_size)
    out["trainer"] = os.path.basename(sys.argv[0] or "main.py")
    out["git_commit"] = str(git_commit())
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        out["slurm_job_id"] = job + (f"_{os.environ['SLURM_ARRAY_TASK_ID']}"
                                     if os.environ.get("SLURM_ARRAY_TASK_ID") else "")
    return out


class Tracker:
    """The MLflow run of one training run, on the process that reports (see the module)."""

    def __init__(self, args, world_size, history, state=None, parent=None, nests=False):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        # MLflow's own "View run" line at every end (a search's trial ends each epoch): the run
        # says where it logs once, as it starts.
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "1")
        try:
            from mlflow.entities import Metric, Param, RunTag
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise UsageError(f"--mlflow needs MLflow, which is not installed here: {INSTALL}") \
                from None
        self.Metric, self.Param, self.RunTag = Metric, Param, RunTag
        self.args, self.uri = args, uri_of(args)
        self.client = MlflowClient(tracking_uri=self.uri)
        self.run_id = (state or {}).get("mlflow_run_id")
        self.failing = False  # the server did not answer the last request
        self.spent, self.logged = 0.0, 0  # seconds in log_epochs, epochs it was given
        self.nests = nests  # main_sweep.py's run, which the runs are nested under
        self.world_size, self.params_due = world_size, True
        # The epochs to send; until `known`, some may be on the server already (a run continued,
        # or a request that failed after the server took it), and are dropped before a send.
        self.pending, self.known = list(history), self.run_id is None
        try:
            if self.run_id is None:
                self.run_id = self._create(parent)
                if not nests:  # main_sweep.py's run says where it is after the job's summary
                    print(f"mlflow: logging to run {self.run_id} at {self.uri}", flush=True)
            self._catch_up()
        except Exception as e:
            if self.run_id is None:  # nothing to continue: a fresh run needs its server now
                raise UsageError(f"--mlflow {self.uri}: no MLflow tracking server answers "
                                 f"({_short(e)}); start it, fix the URI, or drop --mlflow") \
                    from None
            self._lost(e)
        _last["tracker"] = self

    @property
    def state(self):
        """What the checkpoint keeps of it: the MLflow run to continue."""
        return {"mlflow_run_id": self.run_id}

    def _create(self, parent):
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "cifar10")
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = (experiment.experiment_id if experiment
                         else self.client.create_experiment(name))
        tags = {"mlflow.source.name": os.path.basename(sys.argv[0] or "main.py"),
                "checkpoint_dir": os.path.abspath(self.args.checkpoint_dir)}
        if parent:
            tags["mlflow.parentRunId"] = parent
        name = os.path.basename(os.path.abspath(self.args.checkpoint_dir))
        return self.client.create_run(experiment_id, tags=tags, run_name=name).info.run_id

    def _send_params(self):
        """The run's params, those it lacks: all of a new run's. A param a restart changed (--lr,
        the world size) keeps its first value, and the new one is a tag, resumed.<key>. The run
        is marked running (again)."""
        logged = self.client.get_run(self.run_id).data.params
        params, tags = [], []
        for k, v in params_of(self.args, self.world_size).items():
            if k not in logged:
                params.append(self.Param(k, v[:6000]))
            elif logged[k] != v[:6000]:
                tags.append(self.RunTag(f"resumed.{k}", v[:5000]))
        for i in range(0, max(len(params), len(tags)), 100):
            self.client.log_batch(self.run_id, params=params[i:i + 100], tags=tags[i:i + 100])
        self.client.update_run(self.run_id, status="RUNNING")
        self.params_due = False

    def _catch_up(self):
        """Before sending epochs: those the server has dropped from them, where that is not
        known, and the params sent where they are due."""
        if not self.known:
            sent = {m.step for m in self.client.get_metric_history(self.run_id, "test_acc")}
            self.pending = [r for r in self.pending if r["epoch"] not in sent]
            self.known = True
        if self.params_due:
            self._send_params()

    def log_epochs(self, rows):
        """Add the rows to what is to be sent, and send it all if the server answers."""
        t0 = time.perf_counter()
        self.pending += list(rows)
        self.logged += len(rows)
        self.flush()
        self.spent += time.perf_counter() - t0

    def flush(self):
        """Send the epochs kept; True when none is left."""
        if not self.pending and not self.params_due:
            return True
        try:
            self._catch_up()
            now = int(time.time() * 1000)
            metrics = [self.Metric(k, float(r[k]), now, int(r["epoch"]))
                       for r in self.pending for k in METRICS]
            for i in range(0, len(metrics), BATCH):
                self.client.log_batch(self.run_id, metrics=metrics[i:i + BATCH])
        except Exception as e:
            self._lost(e)
            return False
        if self.failing:
            epochs = [r["epoch"] for r in self.pending]
            print(f"mlflow: {self.uri} answers again"
                  + (f"; epochs {_span(epochs)} logged" if epochs else ""), flush=True)
            self.failing = False
        self.pending = []
        return True

    def _lost(self, error):
        self.known = False  # the failed request may have reached the server
        if not self.failing:
            print(f"mlflow: {self.uri} does not answer ({_short(error)}); training goes on, and "
                  "its epochs are logged when it answers again", file=sys.stderr, flush=True)
        self.failing = True

    def finish(self, folder, log_model=False, files=("metrics.csv", "curves.svg")):
        """The end of the run: the epochs left, the artifacts, and the run marked finished. What
        the server does not take is said in one line; metrics.csv holds it all."""
        if not self.flush():
            print(f"mlflow: epochs {_span([r['epoch'] for r in self.pending])} were not logged: "
                  f"{self.uri} did not answer; they are in {folder}/metrics.csv", file=sys.stderr,
                  flush=True)
            return
        files = list(files) + (["best.pth"] if log_model else [])
        try:
            for name in files:
                path = os.path.join(folder, name)
                if os.path.isfile(path):
                    where = "checkpoint" if name == "best.pth" else None
                    self.client.log_artifact(self.run_id, path, where)
            self.client.set_terminated(self.run_id, "FINISHED")
            if self.nests:  # main_sweep.py's run, after the job's summary
                print(f"mlflow: the runs are nested under run {self.run_id} at {self.uri}",
                      flush=True)
            elif self.logged:
                each = self.spent / self.logged * 1e3
                print(f"mlflow: {self.logged} epochs logged, {each:.1f} ms an epoch", flush=True)
        except Exception as e:
            print(f"mlflow: {self.uri} did not take the run's files ({_short(e)}); they are in "
                  f"{folder}", file=sys.stderr, flush=True)


def parent_run(args, world_size):
    """main_sweep.py's MLflow run (world rank 0), under which each run or trial is nested
    (--mlflow-parent): the one CHECKPOINT_DIR/.mlflow-run.json names (a job submitted again),
    else a new one, named there. A Tracker, or None without --mlflow."""
    if uri_of(args) is None:
        return None
    path = os.path.join(args.checkpoint_dir, PARENT)
    try:
        with open(path) as f:
            state = json.load(f)
    except (OSError, ValueError):
        state = None
    tracker = Tracker(args, world_size, [], state, nests=True)
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    safeio.atomic_write(path, lambda f: f.write(json.dumps(tracker.state).encode()))
    return tracker


def end_trial(folder, state):
    """main_sweep.py --search, on the process that was rank 0 of a trial's last run: its MLflow
    run ended as Optuna ended the trial (TRIAL_STATUS), with the tag optuna.state. Nothing
    without --mlflow, or where that run was not this trial's (it failed before it logged)."""
    tracker = _last.pop("tracker", None)
    if tracker is None or os.path.abspath(tracker.args.checkpoint_dir) != os.path.abspath(folder):
        return
    try:
        tracker.client.set_tag(tracker.run_id, "optuna.state", state)
        tracker.client.set_terminated(tracker.run_id, TRIAL_STATUS[state])
    except Exception as e:
        tracker._lost(e)


def _short(error):
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:200]


def _span(epochs):
    return f"{epochs[0]}-{epochs[-1]}" if len(epochs) > 1 else str(epochs[0])
