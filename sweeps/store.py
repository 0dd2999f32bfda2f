"""Where a --search study is kept, how a job holds it, and how a group takes a trial from it
without another group taking the same one.

Two stores, after Optuna's guidance for several processes and for several machines:

- `Journal` (the default): CHECKPOINT_DIR/study.journal, Optuna's JournalStorage over its file
  backend, which optuna-dashboard reads. For one host, or a filesystem whose locks work across
  hosts (NFS v4, Lustre mounted with -o flock). One job at a time holds the study (a flock on
  CHECKPOINT_DIR/.study.lock), so the trials it finds running were left by an earlier job, and
  are taken up first. The file is copied aside (study.journal.bak) when a job takes it. Where
  the filesystem keeps no locks (flock fails with ENOSYS: Lustre mounted noflock), the job stops
  in one line naming the database.
- `Database` (--storage postgresql://USER@HOST/DB): Optuna's RDBStorage, with heartbeats. Any
  number of jobs, on any hosts, work on the study at once; its name is "search
  CHECKPOINT_DIR" (the folder's absolute path, the same on every host), so one database keeps
  the studies of many folders. A group takes a trial under a
  PostgreSQL advisory lock; the group's rank 0 records the trial's heartbeat every --heartbeat
  seconds while it trains it. A trial still running whose heartbeat is older than twice that
  lost its group (killed, or its job stopped): the next group to take a trial takes it up
  under its number, from its checkpoint. A group finds nothing to take only once no trial is
  running: it waits while another group's trial might still need taking up. The database may
  go away for a while (a restart, a failover, a connection dropped while idle): every call to it
  checks its connection first (pool_pre_ping) and is retried for up to RETRY_S seconds
  (CIFAR_STUDY_RETRY_S where set), so that costs the job a pause, not its end; a trial being
  taken when the connection dropped is taken again from the start. A database away for longer,
  or a call that hangs that long (`watched`), ends the job, every process of it.
"""
import contextlib
import json
import os
import sys
import threading
import time
import urllib.parse
import warnings

from training.base import safeio
from training.base.errors import TrainerError, UsageError
from training.base.redact import redact

STUDY = "study.journal"  # in CHECKPOINT_DIR: the study, Optuna's journal
COPY = ".bak"  # STUDY + COPY: the study as it was when the job that holds it started
JOURNAL_LOCK = ".lock"  # STUDY + JOURNAL_LOCK: Optuna's lock file for an append
HOLDER = ".study.lock"  # in CHECKPOINT_DIR: held by the job that runs the study
TAKE_LOCK = ".search-take.lock"  # in CHECKPOINT_DIR: a trial is taken under it
LEFT_RUNNING = ".search-left-running"  # in CHECKPOINT_DIR: trials an earlier job left running
SCHEMES = ("postgresql", "postgresql+psycopg")  # SQLAlchemy 2.1 takes psycopg 3 for both
RETRY_S = 60.0  # how long a call to the study's database is retried while it does not answer


def store_of(args):
    """The study's store, from --storage: the journal without one, else the database."""
    return Database(args) if args.storage else Journal(args)


def check_storage(url):
    """--storage's URL, or a UsageError naming what it takes."""
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in SCHEMES:
        raise UsageError("--storage takes a PostgreSQL URL, postgresql://USER@HOST[:PORT]/DB, "
                         f"not {redact(url)!r}; without --storage the study is "
                         f"CHECKPOINT_DIR/{STUDY}")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise UsageError("--storage postgresql:// needs psycopg, which this environment lacks: "
                         "run `make setup`, or `pip install 'psycopg[binary]'`") from None
    return url


def check_journal(path):
    """Raise ValueError, naming the line, where the study file holds a line that is not JSON or
    ends in a line cut short. Optuna reads past a bad last line, and then appends after it, which
    makes the file unreadable to every later reader: so a job that finds one writes nothing."""
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    if lines[-1]:
        raise ValueError(f"line {len(lines)} was cut short")
    for i, line in enumerate(lines[:-1], 1):
        try:
            json.loads(line)
        except ValueError as e:
            raise ValueError(f"line {i}: {e}") from None


class Journal:
    """The study in CHECKPOINT_DIR/study.journal, held by one job at a time."""

    def __init__(self, args):
        self.folder = args.checkpoint_dir
        self.path = os.path.join(self.folder, STUDY)
        self.where, self.name = self.path, "search"
        self.dashboard = ["optuna-dashboard", self.path]

    def storage(self):
        """Optuna's journal, its appends under a lock file beside it (O_EXCL, which NFS v3 and
        later make atomic). Without Optuna's grace period, which breaks a lock held longer than
        30 s: a filesystem that stalls longer would let a second writer in, mid-line. A lock
        left by a process that died appending is removed by the next job as it holds the study
        (`hold`); no other job can be writing."""
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
        lock = JournalFileOpenLock(self.path, grace_period=None)
        return JournalStorage(JournalFileBackend(self.path, lock_obj=lock))

    def saved(self):
        """The study's user attributes, or None where there is no file yet; read once this job
        holds the study (`hold`), so that no other job appends to it meanwhile. Refuses a file
        that cannot be read or holds no such study, leaving the file and its copy as they
        were."""
        name = self.name
        import optuna
        if not os.path.isfile(self.path):
            return None
        self._lock()
        try:
            check_journal(self.path)
            names = optuna.get_all_study_names(self.storage())
            saved = (optuna.load_study(study_name=name, storage=self.storage()).user_attrs
                     if name in names else None)
        except Exception as e:  # Optuna's own errors, which name the line it could not read
            copy = (f"restore it from {self.path}{COPY} (the copy made when the last job "
                    "started), or " if os.path.isfile(self.path + COPY) else "")
            raise TrainerError(f"cannot read the study {self.path} ({e}); {copy}choose another "
                               "--checkpoint-dir") from e
        if saved is None:
            raise UsageError(f"{self.path} holds no study named {name!r} (it has {names}); "
                             "choose another --checkpoint-dir")
        return saved

    def hold(self):
        """Hold the study for this job (world rank 0, for its life), and keep a copy of the
        file as it is, before this job writes to it."""
        self._lock()
        if os.path.isfile(self.path):
            with open(self.path, "rb") as f:  # read whole by `saved`: kept aside as it is
                kept = f.read()
            safeio.atomic_write(self.path + COPY, lambda f: f.write(kept))

    def _lock(self):
        """The study held by this job, for its life (again: nothing)."""
        os.makedirs(self.folder, exist_ok=True)
        try:
            holder = safeio.hold(os.path.join(self.folder, HOLDER), f"process {os.getpid()}")
        except TrainerError as e:
            raise TrainerError(f"{e}; or keep the study in a database, which needs none: "
                               "--storage postgresql://USER@HOST/DB") from None
        if holder is not None:
            raise self._in_use(holder)
        with contextlib.suppress(FileNotFoundError):  # Optuna's, left by a process that died
            os.remove(self.path + JOURNAL_LOCK)

    def _in_use(self, holder):
        return UsageError(f"the study {self.path} is in use by another job "
                          f"({holder or 'starting'}); wait for it to end, or choose another "
                          "--checkpoint-dir")

    def opened(self, trials):
        """World rank 0, the study open: the trials left running are an earlier job's."""
        import optuna
        running = [t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING]
        safeio.atomic_write(os.path.join(self.folder, LEFT_RUNNING),
                            lambda f: f.write(json.dumps(running).encode()))

    def taking(self):
        return safeio.locked(os.path.join(self.folder, TAKE_LOCK))

    def left(self, study):
        """Under `taking`: the next trial an earlier job left running, now this group's."""
        path = os.path.join(self.folder, LEFT_RUNNING)
        with open(path) as f:
            left = json.load(f)
        if not left:
            return None
        safeio.atomic_write(path, lambda f: f.write(json.dumps(left[1:]).encode()))
        return left[0]

    def claim(self, study, trial_id):
        """A trial just taken: nothing to record, the job's hold covers it."""

    def wait_s(self, study):
        """Under `taking`, the study full: None, as this job runs every trial still running."""
        return None

    def beating(self, study, trial_id):
        return contextlib.nullcontext()


class Database:
    """The study in PostgreSQL, shared by any number of jobs, each trial's group alive by its
    heartbeat."""

    def __init__(self, args):
        self.url, self.interval = args.storage, args.heartbeat
        # Printed and shown: without the password (libpq also takes it from PGPASSWORD or
        # ~/.pgpass, which keeps it off the command line).
        self.where = redact(self.url)
        self.dashboard = ["optuna-dashboard", self.where]
        self.folder = os.path.abspath(args.checkpoint_dir)
        self.name = f"search {self.folder}"  # a database holds a study for each folder
        self._engine = self._held = None

    def storage(self, retry_s=None):
        """Optuna's RDBStorage of the study, each call retried for retry_s (RETRY_S)."""
        from optuna.exceptions import ExperimentalWarning

        def make():
            s = retrying_rdb()(self.url, heartbeat_interval=self.interval,
                               grace_period=2 * self.interval,
                               engine_kwargs={"pool_pre_ping": True})
            s.retry_s = retry_s
            return s
        with warnings.catch_warnings():  # heartbeats have been "experimental" since Optuna 2.9
            warnings.simplefilter("ignore", ExperimentalWarning)
            return retried(make, retry_s)

    def saved(self):
        """The study's user attributes, or None where the database has no such study yet."""
        import optuna
        try:  # the job's first call: a wrong URL is said at once, not retried
            names = optuna.get_all_study_names(self.storage(retry_s=0))
        except Exception as e:  # SQLAlchemy's: the server down, a wrong user or database
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise TrainerError(f"cannot reach the study's database {self.where} "
                               f"({redact(first)}); "
                               "check the server and the URL of --storage") from None
        if self.name not in names:
            return None
        return optuna.load_study(study_name=self.name, storage=self.storage()).user_attrs

    def hold(self):
        """Nothing to hold: jobs share the study."""
        os.makedirs(self.folder, exist_ok=True)

    def opened(self, trials):
        """Nothing to note: a trial left running is known by its stale heartbeat."""

    @contextlib.contextmanager
    def taking(self):
        """An advisory lock of the database, for the whole study, held while a trial is taken:
        the server drops it with the connection, however the process ends. Where the connection
        is lost before the block ends, the lock may have been another group's meanwhile: the
        error raises (connection_lost), and the caller takes again (Study.take)."""
        import sqlalchemy
        if self._engine is None:
            self._engine = sqlalchemy.create_engine(self.url, poolclass=sqlalchemy.pool.NullPool)
        connection = watched(self._engine.connect)
        try:
            transaction = connection.begin()
            lock = sqlalchemy.text("SELECT pg_advisory_xact_lock(:key)")
            watched(lambda: connection.execute(lock, {"key": _lock_key(self.folder)}))
            self._held = connection
            try:
                yield
            finally:
                self._held = None
            watched(transaction.commit)
        finally:
            with contextlib.suppress(Exception):
                connection.close()

    def left(self, study):
        """Under `taking`: the first trial that lost its group, now this group's: one whose
        heartbeat went stale, or one asked for and never claimed (its process died in between;
        under the lock, every live group records a trial's first heartbeat before it lets go,
        so a running trial with none has no group)."""
        from optuna.trial import TrialState
        import sqlalchemy
        stale = set(study._storage._get_stale_trial_ids(study._study_id))  # no public call
        beating = {row[0] for row in watched(lambda: self._held.execute(
            sqlalchemy.text("SELECT trial_id FROM trial_heartbeats")))}  # Optuna's own table
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        return min((t.number for t in running if t._trial_id in stale
                    or t._trial_id not in beating), default=None)

    def claim(self, study, trial_id):
        """A trial just taken: its heartbeat now, before another group could find it stale."""
        study._storage.record_heartbeat(trial_id)

    def wait_s(self, study):
        """Under `taking`, the study full: seconds to wait before taking again while a trial is
        still running (another group's, which may yet need taking up), else None."""
        from optuna.trial import TrialState
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        return self.interval if running else None

    @contextlib.contextmanager
    def beating(self, study, trial_id):
        """The trial's heartbeat every --heartbeat seconds, from a thread, while the block runs."""
        stop = threading.Event()

        from optuna.storages import RDBStorage
        backend = getattr(study._storage, "_backend", study._storage)  # under Optuna's cache

        def beat():
            missed = None  # why the beats fail, since the first that did
            while not stop.wait(self.interval):
                try:  # once: not retried, which would hold the next beat back
                    RDBStorage.record_heartbeat(backend, trial_id)
                except Exception as e:  # a late beat, not the trial's end: said once
                    if missed is None:
                        missed = _first_line(e)
                        print(f"search: the trial's heartbeat is not recorded ({missed}); after "
                              f"{2 * self.interval:g} s without one, another group may take "
                              "the trial up", flush=True)
                    continue
                if missed is not None:
                    missed = None
                    print("search: the trial's heartbeat is recorded again", flush=True)
        thread = threading.Thread(target=beat, name="trial heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(retry_s())  # a beat hung on a connection the network dropped: left


def connection_lost(e):
    """Where `e`, or what caused it, is a database that did not answer or dropped the
    connection, which a later try may not meet (SQLAlchemy's OperationalError, InterfaceError
    and DisconnectionError, which Optuna raises as its StorageInternalError): that error; else
    None."""
    while e is not None:
        if type(e).__name__ in ("OperationalError", "InterfaceError", "DisconnectionError"):
            return e
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return None


def retried(call, seconds=None, say=print):
    """call(), tried again while the database does not answer (connection_lost), waiting 0.5 s
    and then twice as long each time up to 8 s, for `seconds` (retry_s()) in all; then a
    TrainerError that says so. With seconds=0, call() once, and its own error."""
    seconds = retry_s() if seconds is None else seconds
    deadline = time.monotonic() + seconds
    wait, said = 0.5, False
    while True:
        try:
            out = call()
        except Exception as e:
            lost = connection_lost(e)
            if lost is None or seconds <= 0:
                raise
            if time.monotonic() + wait > deadline:
                raise TrainerError(f"the study's database did not answer for {seconds:g} s "
                                   f"({_first_line(lost)}); submit the same command again once "
                                   "it answers: the study goes on from its checkpoints") from None
            if not said:
                say(f"search: the study's database does not answer ({_first_line(lost)}); trying "
                    f"again for up to {seconds:g} s", flush=True)
                said = True
            time.sleep(wait)
            wait = min(2 * wait, 8.0)
            continue
        if said:
            say("search: the study's database answers again", flush=True)
        return out


def watched(call, seconds=None):
    """call(), bounded by `seconds` (retry_s()): a database that hangs rather than fails (its
    server frozen, or packets dropped on the way: a query then waits on TCP for many minutes,
    and no retry starts) ends the job as one out of retries does, one line and every process
    ended (MPI_Abort), since the call in flight cannot be interrupted."""
    seconds = seconds or retry_s()
    done = threading.Event()

    def watch():
        if done.wait(seconds):
            return
        from training.run import launch
        launch.say(f"{os.path.basename(sys.argv[0])}: error (rank {launch.launcher_rank()}): the "
                   f"study's database did not answer for {seconds:g} s (a call hung); submit the "
                   "same command again once it answers: the study goes on from its checkpoints")
        mpi = sys.modules.get("mpi4py.MPI")  # imported, not started here
        if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
            mpi.COMM_WORLD.Abort(TrainerError.exit_code)
        os._exit(TrainerError.exit_code)
    threading.Thread(target=watch, name="database watch", daemon=True).start()
    try:
        return call()
    finally:
        done.set()


def retry_s():
    """How long a call to the study's database is retried: RETRY_S, or CIFAR_STUDY_RETRY_S."""
    return float(os.environ.get("CIFAR_STUDY_RETRY_S", RETRY_S))


def _first_line(e):
    text = str(e).strip().splitlines()
    return redact(text[0] if text else type(e).__name__)[:200]


_retrying = {}


def retrying_rdb():
    """Optuna's RDBStorage with each of its calls retried (retried): a subclass made once, so
    that Optuna still knows it as an RDBStorage (its cache and heartbeats)."""
    if "class" not in _retrying:
        from optuna.storages import RDBStorage

        def wrap(method):
            def call(self, *a, **kw):
                seconds = getattr(self, "retry_s", None)
                return retried(lambda: watched(lambda: method(self, *a, **kw), seconds), seconds)
            call.__name__, call.__doc__ = method.__name__, method.__doc__
            return call
        # Its public calls, and the private ones Optuna's cache in front of it makes.
        names = [n for n in dir(RDBStorage) if callable(getattr(RDBStorage, n)) and n.startswith(
            ("get_", "set_", "create_", "record_", "check_", "delete_"))]
        names += ["_create_new_trial", "_get_best_trial_id", "_get_stale_trial_ids", "_get_trials",
                  "_set_trial_param"]
        _retrying["class"] = type("RetryingRDBStorage", (RDBStorage,),
                                  {n: wrap(getattr(RDBStorage, n)) for n in names})
    return _retrying["class"]


def _lock_key(folder):
    """A 63-bit advisory lock key of the study's folder."""
    import hashlib
    return int.from_bytes(hashlib.sha256(folder.encode()).digest()[:8], "big") >> 1


def quiet_heartbeat_warning():
    """Optuna warns that heartbeats are meant for Study.optimize; here the group's rank 0
    records them itself (Database.beating)."""
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")

