"""main_sweep.py --search: an Optuna study over the job's groups, with pruning, that survives its
job.

    mpirun -np 8 python main_sweep.py --arch resnet18 --epochs 30 --trials 40 \\
        --search lr=log:0.01:1 --search weight-decay=log:1e-5:1e-3 --search arch=resnet18,vgg16

The study is CHECKPOINT_DIR/study.journal, a file optuna-dashboard reads, or a PostgreSQL
database with --storage (store.py says which to use where). The job's processes form groups as a
sweep's do (groups.py). A group's rank 0 takes the next trial (`Study.take`, under the store's
lock, so that the study never holds more than --trials): first a trial that lost its group (an
earlier job's, or a dead group's), else a new one asked of the study, its values drawn by the
sampler; and it sends the trial to its group. Each trial is an ordinary main_horovod.py run of
its group in CHECKPOINT_DIR/trial-<n>/, every line it prints headed by `trial <n>`.

A trial is trained one epoch per call (--auto-resume --stop-at E), so that after each epoch
its rank 0 reports the epoch's test accuracy to the study and the pruner decides, without a hook
in the trainer's loop; the decision goes to the group. A pruned trial is not resumed again: it
ends with its files as they are, and its group takes the next trial. Every epoch is a
checkpoint, so a stop signal, a requeue or the same command submitted again resumes the study:
trials left running continue from their checkpoints under the same number, finished ones are
never trained again. A trial that fails (a divergence, which ends a run alone with exit status
3; a corrupt checkpoint) is told to the study as failed, its reason a user attribute, and the
search goes on. One job at a time runs a journal's study, any number a database's. World rank 0
sums the study up at the end (report.py).
"""
import contextlib
import json
import os
import re
import shlex
import sys
import time
import uuid

from sweeps import flags, groups, report, store
from sweeps.headed import headed
from training.base.errors import UsageError
from training.run import cli, launch, rundir, tracking


def trial_folder(args, number):
    return os.path.join(args.checkpoint_dir, f"trial-{number}")


def keep_aside(folder):
    """A new trial's folder that exists already belongs to a trial the study no longer holds (a
    study file restored from its copy): moved aside, so that the new trial does not resume it."""
    if os.path.exists(folder):
        aside = f"{folder}.{time.strftime('%Y%m%d-%H%M%S')}"
        os.replace(folder, aside)
        print(f"{folder} held a trial the study no longer has: moved to {aside}", flush=True)


def trial_values(space, params):
    """[(flag, value as the command line gives it)] of a trial's parameters: floats in full
    (repr), so that the trial's flags give its values bit for bit."""
    return [(axis.flag, repr(params[axis.flag]) if isinstance(params[axis.flag], float)
             else str(params[axis.flag])) for axis in space]


def trial_argv(args, argv, number, values, epoch):
    """The flags of a trial's run up to `epoch`: the job's without main_sweep.py's own, the
    trial's values, its folder; resumed from its checkpoint, and stopped after the epoch."""
    return [*flags.run_flags(argv), *(f"--{flag}={value}" for flag, value in values),
            "--checkpoint-dir", trial_folder(args, number), "--auto-resume",
            "--stop-at", str(epoch)]


def alone_argv(args, argv, values, folder):
    """The flags that retrain a trial alone with main_horovod.py, in `folder`: the job's, less
    its folder, the flags the trial sets and the job's MLflow run, then the trial's values."""
    replaced = ["--checkpoint-dir", *(f"--{flag}" for flag, _ in values)]
    kept = flags.without(flags.run_flags(argv), replaced)
    return [*kept, *(f"--{flag}={value}" for flag, value in values), "--checkpoint-dir", folder]


def space_record(space):
    """The search space as the study keeps it (a user attribute), JSON's plain values."""
    return json.loads(json.dumps([[axis.flag, axis.kind, list(axis.values)] for axis in space]))


def space_text(record):
    return " ".join(f"--search {flag}=" + (",".join(values) if kind == "choice" else
                                           ("log:" if kind == "log" else "")
                                           + ":".join(f"{v:g}" for v in values))
                    for flag, kind, values in record)


def run(main, args, argv):
    """main_sweep.py --search: every check first (check_search), then the job's course
    (groups.run_job of a StudyJob); RunsFailed where no trial completed."""
    from mpi4py import MPI
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise UsageError("--search needs optuna, which this environment lacks: run `make setup` "
                         "where pip reaches a package index, or `pip install optuna`") from None
    per_run = check_search(args, argv, MPI.COMM_WORLD.Get_size())
    parent = groups.nested(args)  # the search's MLflow run, with --mlflow
    groups.run_job(StudyJob(main, args, argv, per_run, parent))


class StudyJob(groups.Job):
    """The search's course: the study opened on world rank 0 (open_study), each group training
    trials from it until it holds --trials and none is left running (train_trial each), and
    world rank 0 summing the study up (summarize)."""

    def __init__(self, main, args, argv, per_run, parent):
        self.main, self.args, self.argv = main, args, argv
        self.per_run, self.parent = per_run, parent

    def prepare(self):
        return open_study(self.args)

    def source(self, index, prepared):
        return Study(self.args, index, prepared)

    def train(self, group, study, trial, ranks):
        train_trial(self.main, self.args, self.argv, group, study, *trial)

    def summarize(self, outcomes):
        completed = summarize(self.args, self.argv, self.per_run)
        if self.parent is not None:
            self.parent.finish(self.args.checkpoint_dir, files=("search.csv", "search.svg"))
        if not completed:
            return (f"none of the {self.args.trials} trials completed (their errors are above, "
                    f"and their rows in {os.path.join(self.args.checkpoint_dir, 'search.csv')})")
        return None


def check_search(args, argv, processes):
    """The processes per trial, once every check that can fail for the whole search has passed
    on every rank alike, before any work: the controller, the flags of a trial at each end of
    every range and with each choice, the ranks per trial."""
    groups.check_controller("--search")
    if args.storage:
        store.check_storage(args.storage)
    parser = cli.add_horovod_args(cli.build_parser(""))
    first = [(axis.flag, str(axis.values[0])) for axis in args.search]
    for i, axis in enumerate(args.search):
        for value in axis.values:
            values = first[:i] + [(axis.flag, str(value))] + first[i + 1:]
            cli.parse_args(parser, trial_argv(args, argv, 0, values, 1))
    return groups.ranks_per_run(args, args.trials, processes)


def summarize(args, argv, per_run):
    """World rank 0, once every trial has ended: the study summed up (report.py), with
    the command that retrains its best trial alone. Returns how many trials completed."""
    import optuna
    kept = store.store_of(args)
    trials = optuna.load_study(study_name=kept.name, storage=kept.storage()).get_trials()
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    best = max(done, key=lambda t: t.value, default=None)
    retrain = retrain_command(args, argv, best, per_run) if best else ""
    return report.write_study(args.checkpoint_dir, [axis.flag for axis in args.search], trials,
                               retrain, shlex.join(kept.dashboard), kept.where)


def retrain_command(args, argv, trial, per_run):
    """The command that trains `trial` alone with main_horovod.py, on as many processes as its
    group had (so its LR is scaled alike), into CHECKPOINT_DIR/trial-<n>-alone/."""
    script = os.path.join(os.path.dirname(sys.argv[0]), "main_horovod.py")
    folder = trial_folder(args, trial.number) + "-alone"
    cmd = ["python", script, *alone_argv(args, argv, trial_values(args.search, trial.params),
                                         folder)]
    return shlex.join(["mpirun", "-np", str(per_run), *cmd] if per_run > 1 else cmd)


def quiet_optuna():
    """Optuna's own log lines off, and its warnings through the root logger, which writes to
    sys.stderr as it is when they come: inside a trial, headed by its name."""
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.logging.disable_default_handler()
    optuna.logging.enable_propagation()


def open_study(args):
    """World rank 0, before any work: refuse a study that cannot be read, is of another search
    space or (in a database) keeps another --heartbeat (nothing written), hold it for this job
    where the store needs that (store.py), create the study or load it, and note the trials left
    running. Returns (the number of trials the study held, how many jobs had opened it)."""
    import optuna
    quiet_optuna()
    kept = store.store_of(args)
    record = space_record(args.search)
    saved = kept.saved()
    if saved is not None and saved.get("space") != record:
        raise UsageError(f"{kept.where} is a study of another search space "
                         f"({space_text(saved.get('space', []))}); give those --search "
                         "flags to continue it, or another --checkpoint-dir for a new study")
    beat = saved.get("heartbeat") if saved is not None and args.storage else None
    if beat is not None and beat != args.heartbeat:
        raise UsageError(f"the study at {kept.where} has its trials' heartbeat every {beat} s, "
                         f"not {args.heartbeat}: give --heartbeat {beat} (with another, a job "
                         "would take trials that are alive, or wait too long for lost ones)")
    kept.hold()
    with launch.stops_held():
        study = optuna.create_study(study_name=kept.name, storage=kept.storage(),
                                    direction="maximize", load_if_exists=True)
        if "space" not in study.user_attrs:
            study.set_user_attr("space", record)
        if args.storage and "heartbeat" not in study.user_attrs:
            study.set_user_attr("heartbeat", args.heartbeat)
        job = store.retried(lambda: count_job(kept, study))
        if not args.storage:
            record_forgotten(args, study)
    trials = study.get_trials(deepcopy=False)
    kept.opened(trials)
    return len(trials), job


def record_forgotten(args, study):
    """A study file restored from an earlier copy has forgotten the trials after it, whose
    folders remain: each number up to the last such folder is recorded as a failed trial, so
    that no number is handed out twice, and the folder keeps its files."""
    import optuna
    held = len(study.get_trials(deepcopy=False))
    numbers = [int(m.group(1)) for name in os.listdir(args.checkpoint_dir)
               if (m := re.fullmatch(r"trial-(\d+)", name))]
    last = max(numbers, default=-1)
    if last < held:
        return
    for number in range(held, last + 1):
        study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.FAIL,
            user_attrs={"folder": trial_folder(args, number), "fail_reason": FORGOTTEN}))
    which = f"trials {held}-{last}" if last > held else f"trial {held}"
    print(f"{args.checkpoint_dir} holds {which}, which the study file does not (restored from "
          "an earlier copy): recorded as failed, the folders kept", flush=True)


# Why a trial the study file forgot failed (record_forgotten).
FORGOTTEN = "the study file was restored from an earlier copy that predates this trial"


def count_job(kept, study):
    """Under the store's lock: how many jobs had opened the study before this one, which is
    now counted among them (each draws trials of its own)."""
    with kept.taking():
        job = study.user_attrs.get("jobs", 0)
        study.set_user_attr("jobs", job + 1)
    return job


def sampler(args, group_index, opened):
    """The group's sampler, seeded by --seed, the group, the trials the study held when the job
    started and how many jobs had opened it before (open_study's `opened`): two groups never draw
    the same values, and neither do a resumed study or two jobs that open one study at once.
    TPE draws its first trials at random (a quarter of --trials, 2 to 10)."""
    import numpy as np
    import optuna
    held, job = opened
    parts = [args.seed, group_index, held] + ([job] if job else [])  # the first job as before
    seed = int(np.random.SeedSequence(parts).generate_state(1)[0])
    if args.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(2, min(10, args.trials // 4)))


def pruner(args):
    """--pruner: the median pruner prunes once a quarter of --trials (1 to 5) have completed;
    Hyperband's resource is the epoch."""
    import optuna
    if args.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=max(1, min(5, args.trials // 4)))
    if args.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=args.epochs)
    return optuna.pruners.NopPruner()


def distributions(space):
    """The search space as Optuna's distributions, by flag."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
    out = {}
    for axis in space:
        if axis.kind == "choice":
            out[axis.flag] = CategoricalDistribution(axis.values)
        else:
            kind = IntDistribution if isinstance(axis.values[0], int) else FloatDistribution
            out[axis.flag] = kind(*axis.values, log=axis.kind == "log")
    return out


class Study:
    """The study as a group's rank 0 sees it: which trial the group takes next, and what the
    study is told after each epoch."""

    def __init__(self, args, group_index, opened):
        import optuna
        quiet_optuna()
        store.quiet_heartbeat_warning()
        self.args, self.store = args, store.store_of(args)
        self.owner = uuid.uuid4().hex  # the trial's "owner" attribute while this group has it
        self.study = optuna.load_study(study_name=self.store.name, storage=self.store.storage(),
                                       sampler=sampler(args, group_index, opened),
                                       pruner=pruner(args))

    def live(self, number):
        """Trial `number` as an optuna.Trial, to report to and set attributes on: Optuna has
        no public call for a trial that another process asked for, so by its storage id."""
        from optuna.trial import Trial
        return Trial(self.study, self.study.get_trials(deepcopy=False)[number]._trial_id)

    def beating(self, number):
        """The trial's heartbeat kept while the block trains it, where the store has them."""
        trial_id = self.study.get_trials(deepcopy=False)[number]._trial_id
        return self.store.beating(self.study, trial_id)

    def take(self, ranks):
        """The group's next trial, now its own: (number, its values, the epochs it has
        reported), or None once the study holds --trials and none is running. Under the
        store's lock, so that two groups never take one trial, nor together more than --trials;
        taken again from the start where the database dropped the lock's connection meanwhile."""
        while isinstance(got := store.retried(lambda: self._take_locked(ranks)), float):
            time.sleep(got)  # the study full, another group's trial still running
        if got is None:
            return None
        number, params, done, resumed = got
        values = trial_values(self.args.search, params)
        what = f"resumes after epoch {done}" if done else "resumes" if resumed else "starts"
        print(f"trial {number} {what}: " + " ".join(f"{f}={v}" for f, v in values)
              + f" in {trial_folder(self.args, number)} (ranks {ranks})", flush=True)
        return number, values, done

    def _take_locked(self, ranks):
        """One try of `take` under the lock: (number, params, epochs reported, whether it lost
        its group before), the seconds to wait before the next try, or None."""
        with launch.stops_held(), self.store.taking():
            left = self.store.left(self.study)
            if left is not None:  # a trial that lost its group, first
                trial = self.live(left)
            elif len(self.study.get_trials(deepcopy=False)) < self.args.trials:
                trial = self.study.ask(distributions(self.args.search))
                keep_aside(trial_folder(self.args, trial.number))
                trial.set_user_attr("folder", trial_folder(self.args, trial.number))
            else:
                wait = self.store.wait_s(self.study)
                return None if wait is None else float(wait)
            self.store.claim(self.study, trial._trial_id)
            trial.set_user_attr("ranks", ranks)
            trial.set_user_attr("owner", self.owner)
            done = len(self.study.get_trials(deepcopy=False)[trial.number].intermediate_values)
            return trial.number, trial.params, done, left is not None

    def after_epoch(self, number, epoch, history, whys):
        """Tell the study how the trial's run up to `epoch` went (`history`, its metric rows on
        the group's rank 0; `whys`, why it failed on each rank, None where it did not), and
        return what the group does next: "train" the next epoch, or the trial's end,
        "complete", "pruned" or "failed"; "lost" where another group took the trial up or
        ended it (its heartbeat went stale while this group could not record it): this group
        leaves it, its epoch untold, and trains no further epoch of it."""
        from optuna.exceptions import UpdateFinishedTrialError
        try:
            if store.retried(lambda: self.owned(number)):
                return self._after_epoch(number, epoch, history, whys)
            print(f"trial {number} was taken up by another group (its heartbeat went stale); "
                  "this group leaves it", flush=True)
        except UpdateFinishedTrialError:
            print(f"trial {number} was ended by another group (its heartbeat went stale); this "
                  "group leaves it", flush=True)
        return "lost"

    def owned(self, number):
        """Whether trial `number` is still this group's: read from the storage itself (a
        running trial is never served from Optuna's cache)."""
        trial_id = self.study.get_trials(deepcopy=False)[number]._trial_id
        return self.study._storage.get_trial(trial_id).user_attrs.get("owner") == self.owner

    def reported(self, number):
        """The epochs trial `number` has reported, read from the storage itself."""
        trial_id = self.study.get_trials(deepcopy=False)[number]._trial_id
        return len(self.study._storage.get_trial(trial_id).intermediate_values)

    def _after_epoch(self, number, epoch, history, whys):
        from optuna.trial import TrialState
        trial = self.live(number)
        failed = [why for why in whys if why is not None]
        with launch.stops_held(), headed(f"trial {number}"):
            if failed:  # the rank's own error before another rank's failure it caused
                why = next((w for w in failed if w != groups.RUN_PEER_FAILED), failed[0])
                trial.set_user_attr("fail_reason", f"epoch {epoch}: {why}")
                self.study.tell(number, state=TrialState.FAIL)
                tracking.end_trial(trial_folder(self.args, number), "FAIL")
                print(f"failed in epoch {epoch} (the error above); the search goes on",
                      flush=True)
                return "failed"
            acc = next(r["test_acc"] for r in history if r["epoch"] == epoch)
            trial.report(acc, epoch)
            if epoch == self.args.epochs:
                self.study.tell(number, acc)
                tracking.end_trial(trial_folder(self.args, number), "COMPLETE")
                print(f"complete: test acc {acc:.4f} after epoch {epoch}", flush=True)
                return "complete"
            if trial.should_prune():
                self.study.tell(number, state=TrialState.PRUNED)
                tracking.end_trial(trial_folder(self.args, number), "PRUNED")
                print(f"pruned after epoch {epoch} of {self.args.epochs}: test acc {acc:.4f}",
                      flush=True)
                return "pruned"
        return "train"


@contextlib.contextmanager
def held_trial(args, group, study, number, done):
    """The trial's folder held by the group's rank 0 while the group trains the trial. A group
    whose trial was taken up (its heartbeat went stale) trains on to its epoch's end and then
    lets go: the group that took it up waits until then, and goes on from that epoch's
    checkpoint, so no epoch is trained twice, nor by two groups at once. Yields the epochs the
    trial has reported, read again once held; None where the trial is no longer the group's."""
    folder = trial_folder(args, number)
    if study:
        rundir.hold_waiting(folder, lambda holder: print(
            f"trial {number}: its folder is held by {holder} (the group that had it, until its "
            "epoch ends); waiting", flush=True))
        mine = store.retried(lambda: study.owned(number))
        if mine:
            done = store.retried(lambda: study.reported(number))
        else:
            print(f"trial {number} was taken up by another group; this group leaves it", flush=True)
            done = None
    try:
        yield groups.shared(group, done)
    finally:
        if study:
            rundir.let_go(folder)


def train_trial(main, args, argv, group, study, number, values, done):
    """Train trial `number` in this group from the epoch after `done` (the epochs it has
    reported), one epoch per run of main (groups.run_in_group), until it completes, is pruned or
    fails."""
    head = f"trial {number}"
    # From its last epoch again where that was reported but the trial not told complete (a
    # process killed in between): the run then trains nothing and gives the epoch's figures.
    with study.beating(number) if study else contextlib.nullcontext(), \
            held_trial(args, group, study, number, done) as done:
        if done is None:
            return
        for epoch in range(min(done + 1, args.epochs), args.epochs + 1):
            history, why = groups.run_in_group(main, trial_argv(args, argv, number, values,
                                                                epoch), group, head, head)
            whys = group.gather(why, root=0)
            step = study.after_epoch(number, epoch, history, whys) if study else None
            if group.bcast(step, root=0) != "train":
                return
