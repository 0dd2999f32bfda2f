"""What a run reports: progress, epoch lines, metrics.csv, TensorBoard (its scalars, and its
HPARAMS tab's settings and final figures), curves.svg, and MLflow where asked (tracking.py).
Checkpoints are saved by checkpoints.py, and the step's phases timed by phases.py, not here.

Every reporter here takes `reports` (rank 0 is a value): the other ranks build
the same objects and they do nothing. Nothing here talks to other processes:
the numbers it shows were reduced before they arrive.
"""
import csv
import os
import sys

from training.base import redact, safeio
from training.base.safeio import atomic_write
from training.run import curves, launch
from training.run import tracking as tracking_mod

METRICS_COLUMNS = ("epoch", "lr", "train_loss", "train_acc", "test_loss", "test_acc",
                   "epoch_time_s", "train_time_s", "images_per_s", "world_size")


class Progress:
    """tqdm bars on rank 0 when stderr is a terminal. Without one (CI, pytest,
    mpirun and horovodrun pipes) a redrawn bar would be a flood of carriage
    returns, so each log interval prints one plain line instead."""

    def __init__(self, reports):
        self.reports = reports
        self.tty = sys.stderr.isatty()

    def bar(self, total, desc):
        from tqdm import tqdm
        return tqdm(total=total, desc=desc, disable=not (self.reports and self.tty), leave=False,
                    dynamic_ncols=True, file=sys.stderr)

    def interval(self, bar, desc, step, total, **values):
        """Show metrics reduced at a log interval."""
        text = {k: f"{v:.4g}" for k, v in values.items()}
        if self.tty:
            bar.set_postfix(text)
        elif self.reports:
            print(f"{desc} [{step}/{total}] " + " ".join(f"{k} {v}" for k, v in text.items()),
                  flush=True)

    def write(self, line):
        if self.reports:
            print(line, flush=True)


def read_metrics(folder):
    """The rows of a run's metrics.csv (RunLog writes it) as dicts of strings, [] where the run
    has none (it failed in its first epoch)."""
    try:
        with open(os.path.join(folder, "metrics.csv")) as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


class RunLog:
    """The epoch lines, metrics.csv, TensorBoard and curves.svg of a run. Only the process
    with reports=True writes; every process keeps the history."""

    def __init__(self, args, reports, world_size, history, first_epoch=0, tracking=None):
        """first_epoch: the 0-based epoch this run starts at; TensorBoard drops the events
        a crashed run wrote after it. tracking: the checkpoint's tracker state (the MLflow run
        to continue), where there is one."""
        self.args, self.reports, self.world_size = args, reports, world_size
        self.history = with_train_time(history)
        self.dir = args.checkpoint_dir
        self._tb = self._tracker = self._node = None
        self._tracking = tracking
        if (not reports and getattr(args, "mlflow_system_metrics", False)
                and tracking_mod.uri_of(args) and launch.launcher_local_rank() == 0):
            self._node = tracking_mod.NodeMonitor(args)  # another node's, by its first process
        if reports:  # into the folder the run holds (rundir.hold made it)
            from torch.utils.tensorboard import SummaryWriter  # lazy: heavy import
            self._tb = SummaryWriter(os.path.join(self.dir, "tb"), purge_step=first_epoch + 1)
            if tracking_mod.uri_of(args):
                self._tracker = tracking_mod.Tracker(args, world_size, self.history, tracking,
                                                     tracking_mod.nested_under())

    @property
    def tracking(self):
        """What the checkpoint keeps of the run's tracking: the MLflow run it logs to."""
        return self._tracker.state if self._tracker is not None else self._tracking

    def add(self, epoch, train, test, seconds):
        """Print the epoch's line and add its row; returns the history, for the checkpoint."""
        before = self.history[-1]["train_time_s"] if self.history else 0.0
        row = {"epoch": epoch + 1, "lr": train["lr"], "train_loss": train["loss"],
               "train_acc": train["acc"],
               "test_loss": test["loss"], "test_acc": test["acc"], "epoch_time_s": seconds,
               "train_time_s": before + seconds,
               "images_per_s": train["images"] / max(seconds, 1e-9),
               "world_size": self.world_size}
        self.history.append(row)
        if self.reports:
            print(f"epoch {epoch + 1}/{self.args.epochs}  lr {row['lr']:.4g}  "
                  f"train loss {row['train_loss']:.4f} acc {row['train_acc']:.4f}  "
                  f"test loss {row['test_loss']:.4f} acc {row['test_acc']:.4f}  "
                  f"{seconds:.1f}s {row['images_per_s']:.0f} img/s  world {self.world_size}",
                  flush=True)
        return list(self.history)

    def write(self):
        """metrics.csv and TensorBoard up to the last row. Called after the epoch's checkpoint
        is saved: a crash in between loses no row, and a resume rewrites the file from it."""
        if not self.reports:
            return
        self.write_csv()
        row = self.history[-1]
        for k in ("lr", "train_loss", "train_acc", "test_loss", "test_acc", "images_per_s"):
            self._tb.add_scalar(k, row[k], row["epoch"])
        self._tb.flush()
        if self._tracker is not None:
            self._tracker.log_epochs([row])

    def write_csv(self):
        path = os.path.join(self.dir, "metrics.csv")
        safeio.atomic_write_csv(path, METRICS_COLUMNS, self.history)

    def close(self, final=True):
        """End the run's reporting: draw curves.svg and say whether --target-acc was reached.
        final=False ends only this object's writer (an elastic world that is replaced)."""
        if self._node is not None:
            self._node.close()
            self._node = None
        if self._tb is None:
            return
        self._tb.close()
        self._tb = None
        if final and self.history:
            text = curves.svg(self.history).encode()
            atomic_write(os.path.join(self.dir, "curves.svg"), lambda f: f.write(text))
            write_hparams(self.args, self.history, self.world_size,
                          os.path.join(self.dir, "tb", "hparams"))
        if self._tracker is not None:  # where final=False, the MLflow run goes on in the next
            if final:
                self._tracker.finish(self.dir, getattr(self.args, "mlflow_log_model", False))
            else:
                self._tracker.close(None)
        target = self.args.target_acc
        if final and target is not None:
            print(target_line(self.history, target), flush=True)


def hparams_of(args, world_size):
    """The run's settings as TensorBoard's HPARAMS tab shows them: every flag (a value that is not
    a number, text or bool, None among them, as text) and the world size."""
    out = {k: v if isinstance(v, (bool, int, float, str)) else str(v)
           for k, v in sorted(redact.flags(args).items())}
    out["world_size"] = world_size
    return out


def write_hparams(args, history, world_size, folder):
    """`folder` (the run's tb/hparams): its settings and final figures as one session of
    TensorBoard's HPARAMS tab, so that `tensorboard --logdir` over a sweep's or a search's folder
    compares its runs and trials. Written at each end of the run, the folder emptied first: a
    resumed run, or a trial trained an epoch at a time, is one session with its last figures."""
    from torch.utils.tensorboard import SummaryWriter  # lazy: heavy import
    if os.path.isdir(folder):
        for name in os.listdir(folder):
            os.remove(os.path.join(folder, name))
    last = history[-1]
    metrics = {"hparam/final_test_acc": last["test_acc"],
               "hparam/best_test_acc": max(r["test_acc"] for r in history),
               "hparam/epochs": last["epoch"], "hparam/train_time_s": last["train_time_s"]}
    with SummaryWriter(folder) as w:
        w.add_hparams(hparams_of(args, world_size), metrics, run_name=".")


def with_train_time(history):
    """The history's rows, each with train_time_s, the training time up to its end (rows of
    checkpoints written before the column existed get it from their epoch times)."""
    rows, total = [], 0.0
    for r in history:
        total = r.get("train_time_s", total + r["epoch_time_s"])
        rows.append(dict(r, train_time_s=total))
    return rows


def first_reaching(history, target):
    """The first row whose test accuracy reached `target`, or None (also without a target)."""
    if target is None:
        return None
    return next((r for r in history if r["test_acc"] >= target), None)


def target_line(history, target):
    """--target-acc's one line: the epoch and training time that reached it, or that none did."""
    hit = first_reaching(history, target)
    if hit is not None:
        return (f"target test accuracy {target:g} reached at epoch {hit['epoch']} after "
                f"{hit['train_time_s']:.1f} s of training")
    if not history:
        return f"target test accuracy {target:g} not reached: no epoch trained"
    best = max(history, key=lambda r: r["test_acc"])
    return (f"target test accuracy {target:g} not reached by epoch {history[-1]['epoch']} "
            f"(best {best['test_acc']:.4f} at epoch {best['epoch']}; "
            f"{history[-1]['train_time_s']:.1f} s of training)")


def evaluation_line(test):
    """The last line of --evaluate, for scripts: accuracy as a fraction."""
    return f"test_loss={test['loss']:.6f} test_acc={test['acc']:.6f} images={test['images']}"


def report_evaluation(test, reports):
    """--evaluate's result, printed by the rank that reports."""
    Progress(reports).write(evaluation_line(test))
