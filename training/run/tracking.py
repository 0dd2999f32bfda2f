"""MLflow tracking of a run (--mlflow URI, or MLFLOW_TRACKING_URI set): one MLflow run per
training run, written by the process that reports; the other ranks build nothing.

- **Off the training path.** Every request is sent by a thread of its own (the sender,
  sender.py); training hands it each epoch's row and never waits on the network, whatever the
  store. A server that does not answer, at the start or later, stops no training: the run says
  so in one line, keeps the epochs, and the sender creates or continues the MLflow run and sends
  them when the server answers again.
- **One MLflow run per training run.** Its id is written into the run folder (RUN_FILE) as soon
  as it exists, and into each checkpoint: a restart (--resume, --auto-resume, an elastic world
  after a reset, a crash before the first checkpoint) continues it, sending only the epochs the
  server lacks. MLFLOW_RUN_ID and MLFLOW_EXPERIMENT_ID are honoured as MLflow's own
  integrations honour them. A run the server no longer has, or a different server, gets a new
  run and a line saying so.
- **What it holds**: the run's flags, the recipe as resolved, the world size, the trainer,
  MLflow's standard tags (user, source, git commit) and Slurm's job id; each epoch metrics.csv's
  row at step = epoch; at the end metrics.csv, curves.svg and, with --mlflow-log-model, best.pth
  and the model it holds as an MLflow model with its signature (save_model; --mlflow-register
  NAME registers it). Every flag and URI it writes or prints is redacted (training/base/redact.py).
- **--mlflow-system-metrics**: MLflow's monitor of each node (CPU, memory, disk, network, GPUs
  where pynvml is installed) logs into the run as system/<host>/..., from its own thread: rank
  0's node's by rank 0, another node's by its first process (NodeMonitor) where the nodes share
  the run folder.
- **Its status**: FINISHED at the end of training, FAILED where the process ends on an error,
  KILLED on a stop signal; a run stopped by --stop-at short of --epochs stays RUNNING. A search's
  trial ends once, as Optuna ended it (end_trial), its files sent then.
- **main_sweep.py** is an MLflow run of its own (parent_run), with each run and trial nested
  under it.

MLflow is not a requirement of the trainer: it is imported only under --mlflow. Without it,
--mlflow is one line naming the install.
"""
import atexit
import contextlib
import importlib.util
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time

from training.base import recipe, safeio
from training.base.errors import UsageError
from training.base.redact import redact, redacted
from training.run import launch, sender

INSTALL = "pip install mlflow-skinny"  # the client alone; a server needs `pip install mlflow`
SCHEMES = ("http", "https", "file", "sqlite", "postgresql", "mysql", "mssql", "databricks")
RUN_FILE = ".mlflow-run.json"  # in the run folder (main_sweep.py's too): the MLflow run it logs to
# Optuna's end of a trial, as the trial's MLflow run ends (FINISHED where it completed).
TRIAL_STATUS = {"COMPLETE": "FINISHED", "PRUNED": "KILLED", "FAIL": "FAILED"}
# The Tracker this process made last (a search's trial is ended through it), and the run that
# main_sweep.py nests this process's runs under.
_last = {}


def uri_of(args):
    """The tracking URI the run logs to: --mlflow, else MLFLOW_TRACKING_URI, else None."""
    return getattr(args, "mlflow", None) or os.environ.get("MLFLOW_TRACKING_URI") or None


def check_flags(args):
    """One line, before anything runs, for a URI MLflow cannot use, MLflow not installed, an
    --mlflow-* option without MLflow, --mlflow-register without --mlflow-log-model, or
    --mlflow-system-metrics without psutil."""
    uri = uri_of(args)
    if uri is None:
        for flag in ("mlflow_log_model", "mlflow_register", "mlflow_system_metrics"):
            if getattr(args, flag, None):
                raise UsageError(f"--{flag.replace('_', '-')} logs to MLflow: add --mlflow URI")
        return
    if getattr(args, "mlflow_register", None) and not getattr(args, "mlflow_log_model", False):
        raise UsageError("--mlflow-register registers the model --mlflow-log-model logs: add "
                         "--mlflow-log-model")
    if getattr(args, "mlflow_system_metrics", False) and importlib.util.find_spec("psutil") is None:
        raise UsageError("--mlflow-system-metrics needs psutil, which is not installed here: "
                         "pip install psutil")
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower() if ":" in uri else "file"
    if scheme not in SCHEMES:
        raise UsageError(f"--mlflow {redact(uri)}: not a tracking URI MLflow takes "
                         "(http://HOST:PORT, a folder, sqlite:///FILE, postgresql://...); fix it, "
                         "or drop --mlflow")
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
    """Every flag (redacted), the recipe as resolved (recipe.<key>: the flag's value where it
    has one, else the recipe's), the world size, the trainer, the git commit and Slurm's job id:
    as MLflow params (text)."""
    out = {k: str(redacted(v)) for k, v in sorted(vars(args).items()) if not k.startswith("mlflow")}
    for key, value in recipe.chosen(args).items():
        given = getattr(args, key, None)
        out[f"recipe.{key}"] = str(value if given is None else given)
    out["world_size"] = str(world_size)
    out["trainer"] = os.path.basename(sys.argv[0] or "main.py")
    out["git_commit"] = str(git_commit())
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        out["slurm_job_id"] = job + (f"_{os.environ['SLURM_ARRAY_TASK_ID']}"
                                     if os.environ.get("SLURM_ARRAY_TASK_ID") else "")
    return out


def read_run_file(folder):
    """What RUN_FILE in `folder` holds ({"mlflow_run_id", "tracking_uri"}), or None."""
    try:
        with open(os.path.join(folder, RUN_FILE)) as f:
            state = json.load(f)
        return state if isinstance(state, dict) and state.get("mlflow_run_id") else None
    except (OSError, ValueError):
        return None


def write_run_file(folder, state):
    os.makedirs(folder, exist_ok=True)
    text = json.dumps(state).encode()
    safeio.atomic_write(os.path.join(folder, RUN_FILE), lambda f: f.write(text))


def check_client():
    try:
        import mlflow.tracking  # noqa: F401
    except ImportError:
        raise UsageError(f"--mlflow needs MLflow, which is not installed here: {INSTALL}") from None


class Tracker:
    """The MLflow run of one training run, on the process that reports (see the module). Its
    requests go through a sender.Sender; nothing here waits on the network but `close`, for at
    most its `wait_s`."""

    def __init__(self, args, world_size, history, state=None, parent=None, nests=False):
        check_client()
        self.args, self.uri = args, uri_of(args)
        self.shown = redact(self.uri)  # the URI as lines and files show it
        self.folder = args.checkpoint_dir
        self.nests = nests  # main_sweep.py's run, which the runs are nested under
        self.status = None  # the status the run was ended with, once it was
        run_id, why = self._run_to_continue(state, parent)
        self.sender = sender.Sender(self, run_id, world_size, history, parent, why)
        self.sender.start()
        _last["tracker"] = self
        if not _last.get("exit_hook"):  # once a process, at its first tracker
            atexit.register(at_exit)
            _last["exit_hook"] = True
        sender.live.add(self)

    def _run_to_continue(self, state, parent):
        """(the MLflow run to continue, or None for a new one; the line to say if a run named
        is not continued): the checkpoint's, else RUN_FILE's (a run that crashed before its
        first checkpoint; not under --overwrite), else MLFLOW_RUN_ID (not for a nested run)."""
        fresh = getattr(self.args, "overwrite", False) and not getattr(self.args, "resume", False)
        state = state or (None if fresh else read_run_file(self.folder))
        if not state and parent is None and not self.nests and os.environ.get("MLFLOW_RUN_ID"):
            state = {"mlflow_run_id": os.environ["MLFLOW_RUN_ID"]}
        if not state or not state.get("mlflow_run_id"):
            return None, None
        kept = state.get("tracking_uri")
        if kept is not None and kept != self.shown:
            return None, (f"mlflow: run {state['mlflow_run_id']} was logged to {kept}, not "
                          f"{self.shown}; logging to a new run there")
        return state["mlflow_run_id"], None

    def params(self, world_size):
        return params_of(self.args, world_size)

    def commit(self):
        return git_commit()

    @property
    def run_id(self):
        return self.sender.run_id

    @property
    def state(self):
        """What the checkpoint keeps of it: the MLflow run to continue, and where it is."""
        run_id = self.sender.run_id
        return {"mlflow_run_id": run_id, "tracking_uri": self.shown} if run_id else None

    def named(self, run_id):
        """The server has the run: the run folder names it from now on (written again for a run
        continued, so that other nodes' monitors, NodeMonitor, know it is this run's)."""
        state = {"mlflow_run_id": run_id, "tracking_uri": self.shown}
        try:
            write_run_file(self.folder, state)
        except Exception as e:  # the checkpoint will name it all the same
            self.sender.say(f"mlflow: could not write {os.path.join(self.folder, RUN_FILE)} ({e})",
                            error=True)

    def created(self, run_id):
        """The sender made the run: named, and said."""
        self.named(run_id)
        if not self.nests:  # main_sweep.py's run says where it is after the job's summary
            self.sender.say(f"mlflow: logging to run {run_id} at {self.shown}")

    def register(self, run_id):
        """The run's logged model (its artifact folder sender.MODEL_NAME) as a new version of
        --mlflow-register NAME; the version's number (None without the flag)."""
        name = getattr(self.args, "mlflow_register", None)
        if not name:
            return None
        client = self.sender.client
        try:
            client.create_registered_model(name)
        except Exception as e:  # another run registered it first
            if sender.error_code(e) != "RESOURCE_ALREADY_EXISTS":
                raise
        source = f"{client.get_run(run_id).info.artifact_uri}/{sender.MODEL_NAME}"
        return client.create_model_version(name, source, run_id).version

    def system_monitor(self, run_id):
        """MLflow's system-metrics monitor of this node, started, logging into the run (at the
        step after the run's last, where it was monitored before); None without
        --mlflow-system-metrics, and for main_sweep.py's own run."""
        if not getattr(self.args, "mlflow_system_metrics", False) or self.nests:
            return None
        return start_monitor(run_id, self.uri)

    def wait_for_run(self, seconds):
        """The run's id once the server made it, waiting at most `seconds`; None if it did not."""
        return self.sender.wait_for_run(seconds)

    def log_epochs(self, rows):
        """Hand epochs' rows to the sender; returns at once."""
        self.sender.put_rows(rows)

    def close(self, status=None, files=(), tags=None, wait_s=None):
        """End this tracker: the epochs left sent, then `files` (paths) as artifacts, `tags`,
        and the run's `status` where one is given (None: a pause, the run goes on later, as
        after --stop-at). Waits at most wait_s (sender.FINISH_WAIT_S) for the server; what it
        did not take is said in one line, and is in metrics.csv. A status is set once."""
        if self.status is not None:
            return
        self.status = status
        sender.live.discard(self)
        self.sender.end(status, files, tags or {}, wait_s)

    def finish(self, folder, log_model=False, files=("metrics.csv", "curves.svg")):
        """The end of the run's training: FINISHED, with its files. A run that stopped at
        --stop-at short of --epochs (a search's trial between epochs too) is not at its end:
        its epochs are sent, and the run stays RUNNING."""
        stop_at = getattr(self.args, "stop_at", None)
        if stop_at is not None and stop_at < self.args.epochs and not self.nests:
            self.close(None)
        else:
            self.close("FINISHED", artifacts(folder, files, log_model))


def artifacts(folder, files, log_model):
    """The paths of the run's files to log; with log_model, best.pth and its model as an MLflow
    model (save_model: a folder)."""
    names = list(files) + (["best.pth"] if log_model else [])
    paths = [os.path.join(folder, n) for n in names if os.path.isfile(os.path.join(folder, n))]
    if log_model and os.path.join(folder, "best.pth") in paths:
        paths += [p for p in [save_model(folder)] if p]
    return paths


MODEL_DIR = "mlflow-model"  # in the run folder: best.pth's model as an MLflow model (save_model)


def model_of(path):
    """The model a checkpoint holds (best.pth: its state dict, the arch and class count), built
    on the CPU in eval mode; a batch of two CIFAR inputs, float32 (2, 3, 32, 32) normalized as
    training normalizes (data.MEAN, data.STD; two, so that the batch is not fixed at one); and
    the signature they give: (-1, 3, 32, 32) in, the logits (-1, classes) out."""
    from mlflow.models import infer_signature
    import torch

    import models
    state = torch.load(path, map_location="cpu", weights_only=True)
    model = models.get_model(state["arch"], num_classes=state.get("num_classes", 10))
    model.load_state_dict(state["model"])
    model.eval()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(x)
    return model, x.numpy(), infer_signature(x.numpy(), logits.numpy())


def save_model(folder):
    """best.pth's model saved as an MLflow model in folder/MODEL_DIR (one saved before replaced):
    the model, its signature and input example (model_of), in MLflow's default format for
    PyTorch (torch.export's: a graph and its weights, no pickled code; any batch size), MLflow's
    torch and cloudpickle pins as its requirements (none inferred: nothing is imported or
    fetched) and the input's normalization as metadata. On the process that reports, at the end
    of training, on the CPU, without the network. Its path, or None where it could not be saved
    (said in one line: the run's other files go all the same)."""
    import shutil
    path = os.path.join(folder, MODEL_DIR)
    try:
        import mlflow.pytorch

        from training.run import data
        model, example, signature = model_of(os.path.join(folder, "best.pth"))
        shutil.rmtree(path + ".tmp", ignore_errors=True)
        mlflow.pytorch.save_model(
            model, path + ".tmp", signature=signature, input_example=example,
            pip_requirements=mlflow.pytorch.get_default_pip_requirements(),
            metadata={"input_mean": list(data.MEAN), "input_std": list(data.STD)})
        shutil.rmtree(path, ignore_errors=True)
        os.replace(path + ".tmp", path)
        return path
    except Exception as e:
        text = (str(e).strip().splitlines() or [""])[0][:200]
        print(f"mlflow: best.pth's model was not saved as an MLflow model ({type(e).__name__}: "
              f"{text}); best.pth is logged alone", file=sys.stderr, flush=True)
        return None


def nest_runs_under(run_id):
    """main_sweep.py, on every process: the runs this process trains from now on are MLflow
    runs nested under run_id (the job's own, parent_run's); None: runs of their own."""
    _last["parent"] = run_id


def nested_under():
    """The MLflow run that this process's runs are nested under (nest_runs_under), or None."""
    return _last.get("parent")


def start_monitor(run_id, uri):
    """MLflow's system-metrics monitor of this node (system/<host>/...), started."""
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
    logging.getLogger("mlflow.system_metrics").setLevel(logging.ERROR)  # its callers say, or not
    monitor = SystemMetricsMonitor(run_id, resume_logging=True, tracking_uri=uri,
                                   node_id=socket.gethostname().split(".")[0])
    monitor.start()
    return monitor


class NodeMonitor:
    """--mlflow-system-metrics on a node other than rank 0's, run by the node's first process:
    MLflow's monitor of the node, logging into the run once rank 0's sender has named it in the
    run folder (RUN_FILE written since this run began), so only where the nodes share that
    folder. It waits on nothing and says nothing: a node that cannot log trains on."""

    POLL_S = 0.5
    SKEW_S = 5.0  # a shared filesystem's clock against this node's

    def __init__(self, args):
        self.folder, self.uri = args.checkpoint_dir, uri_of(args)
        self.since = time.time() - self.SKEW_S
        self.stopped, self.monitor = threading.Event(), None
        self.thread = threading.Thread(target=self._watch, name="mlflow node monitor", daemon=True)
        self.thread.start()

    def _watch(self):
        path = os.path.join(self.folder, RUN_FILE)
        while not self.stopped.wait(self.POLL_S):
            try:
                fresh = os.stat(path).st_mtime >= self.since
            except OSError:
                continue
            state = read_run_file(self.folder) if fresh else None
            if state is not None and state.get("tracking_uri") == redact(self.uri):
                with contextlib.suppress(Exception):
                    self.monitor = start_monitor(state["mlflow_run_id"], self.uri)
                return

    def close(self):
        self.stopped.set()
        self.thread.join(sender.ABORT_WAIT_S)  # at most: it may be importing MLflow
        if self.monitor is not None:
            with contextlib.suppress(Exception):
                self.monitor.finish()


def parent_run(args, world_size):
    """main_sweep.py's MLflow run (world rank 0), under which each run or trial is nested
    (nest_runs_under): the one CHECKPOINT_DIR/RUN_FILE names (a job submitted again), else a new
    one. (its Tracker, the run's id or None where the server did not make it in time: the runs
    are then not nested); (None, None) without --mlflow."""
    if uri_of(args) is None:
        return None, None
    tracker = Tracker(args, world_size, [], read_run_file(args.checkpoint_dir), nests=True)
    run_id = tracker.wait_for_run(sender.parent_wait_s())
    if run_id is None:
        print(f"mlflow: {tracker.shown} did not answer as the job started: its runs are logged "
              "as runs of their own, not nested under the job's", file=sys.stderr, flush=True)
    return tracker, run_id


def end_trial(folder, state):
    """main_sweep.py --search, on the process that was rank 0 of a trial's last run: its MLflow
    run ended as Optuna ended the trial (TRIAL_STATUS), with the tag optuna.state and the trial's
    files, once: a trial that completed was FINISHED with its files by its last run, and gets
    the tag alone. Nothing without --mlflow, or where that run was not this trial's (it failed
    before it logged)."""
    tracker = _last.pop("tracker", None)
    if tracker is None or os.path.abspath(tracker.folder) != os.path.abspath(folder):
        return
    tags = {"optuna.state": state}
    if tracker.status is not None:
        tracker.sender.end(None, (), tags, None)
        return
    log_model = getattr(tracker.args, "mlflow_log_model", False)
    tracker.close(TRIAL_STATUS[state], artifacts(folder, ("metrics.csv", "curves.svg"), log_model),
                  tags)


def at_exit():
    """The process ends: trackers not closed ended (end_unfinished), then a short wait for what
    every sender was handed last."""
    end_unfinished()
    sender.drain(sender.ABORT_WAIT_S)


def end_unfinished(status=None):
    """Every tracker of this process not yet closed, ended as the process or the run ends:
    KILLED after a stop signal, else FAILED (or `status`). Waits a short, bounded time."""
    if status is None:
        status = "KILLED" if launch.stopped() else "FAILED"
    for tracker in list(sender.live):
        tracker.close(status, wait_s=sender.ABORT_WAIT_S)
