"""The process side of a run: where a launcher put this process, and how it ends.

Before any init, a launcher's environment variables are all a process knows of its
rank (`launcher_rank`) and of the other processes on its host (`torchrun_local`).
`run_cli` runs a trainer's main() and turns its ends into one line and an exit status:
a TrainerError, a failed collective (Horovod's and torch.distributed's exceptions,
recognised by name, said with their cause: another rank's failure, or one every rank met),
Ctrl-C, and the stop signals: SIGTERM, which schedulers send on pre-emption and at time
limits and launchers when they end a job, and the user signal `stop_on` adds. Nothing here
imports Horovod or torch.distributed, parses flags, or trains.
"""
import contextlib
import os
import re
import signal
import sys
import time

from training.base.errors import TrainerError
from training.base.redact import redact

# Where launchers give a process its rank before any init, in the order they are read:
# horovodrun; Open MPI's mpirun; torchrun, whose workers under srun inherit the torchrun
# task's PMIx and Slurm ranks; PMIx (srun --mpi=pmix sets no OMPI_ variable); other MPIs;
# and Slurm's task id last, because mpirun inside an allocation is one Slurm task per node
# (SLURM_PROCID is 0 for every rank of a node).
LAUNCHER_RANK_VARS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "RANK", "PMIX_RANK", "PMI_RANK",
                      "SLURM_PROCID")


def launched():
    """Whether a launcher started this process (it set one of LAUNCHER_RANK_VARS)."""
    return any(var in os.environ for var in LAUNCHER_RANK_VARS)


def launcher_rank():
    """This process's rank as its launcher set it, known before any init (0 without one)."""
    for var in LAUNCHER_RANK_VARS:
        if var in os.environ:
            return int(os.environ[var])
    return 0


# Where launchers give a process its rank among those of its host, in the same order.
LAUNCHER_LOCAL_RANK_VARS = ("HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK",
                            "PMIX_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")


def launcher_local_rank():
    """This process's rank on its host as its launcher set it (0 without one)."""
    for var in LAUNCHER_LOCAL_RANK_VARS:
        if var in os.environ:
            return int(os.environ[var])
    return 0


def torchrun_local():
    """(local rank, local size) as torchrun gives them; (0, 1) without torchrun."""
    return int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))


def peer_failed(e):
    """Whether `e` is how a collective fails when another rank has failed or died:
    Horovod's HorovodInternalError, torch.distributed's backend errors, or gloo's
    transport error (a RuntimeError naming gloo's transport). Matched by name: neither
    library is imported here."""
    if type(e).__name__ in ("HorovodInternalError", "DistBackendError", "DistNetworkError"):
        return True
    return isinstance(e, RuntimeError) and "gloo/transport/" in str(e)


# How a rank whose collective failed ends, however many ranks met it.
PEER_FAILED = "stopping because a collective failed"
PEER_HINT = "if another rank failed or exited, its error is above"


def cause(e, limit=300):
    """The first line of an exception's message, without gloo's source location
    ("[.../unbound_buffer.cc:78] "), cut to `limit` characters; its type where it has none."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", lines[0]) if lines else ""
    text = text or type(e).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


# The signals that stop a run cleanly: SIGTERM always (schedulers send it on pre-emption and
# at time limits, launchers when they end a job), and a user signal where --stop-signal names
# one (Slurm's --signal and `scancel -s`; USR2 is free where NCCL may use USR1 itself).
STOP_SIGNALS = ("TERM", "USR1", "USR2")


class Terminated(KeyboardInterrupt):
    """A stop signal, raised in the main thread as Ctrl-C raises KeyboardInterrupt. Not an
    Exception, so no `except Exception` swallows it, and atomic writes on the way out
    remove their temporaries."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def _ignore_stop_signals():
    """From here the process is on its way out: schedulers and launchers send a stop signal
    more than once (Slurm to every task and step within milliseconds, torchrun's agent a
    SIGTERM after a worker's USR2), and no later one may cut short the stop under way."""
    for name in STOP_SIGNALS:
        signal.signal(getattr(signal, f"SIG{name}"), signal.SIG_IGN)


# A stop signal that arrived inside `stops_held`, raised when it ends; and the one this process
# stops on, once it is raised.
_stops_held = {"depth": 0, "signum": None, "stopping": None}


def stopped():
    """The stop signal this process is stopping on, or None."""
    return _stops_held["stopping"]


def _terminate(signum):
    _ignore_stop_signals()
    _stops_held["stopping"] = signum
    raise Terminated(signum)


def _raise_terminated(signum, frame):
    if _stops_held["depth"]:
        _stops_held["signum"] = _stops_held["signum"] or signum
        return
    _terminate(signum)


@contextlib.contextmanager
def stops_held():
    """Hold the stop signals while the body runs, and stop when it ends: the epoch's
    checkpoint and its metrics.csv row are saved together, or neither is."""
    _stops_held["depth"] += 1
    signum = None
    try:
        yield
    finally:  # an error in the body goes on as it is; the held stop goes with it
        _stops_held["depth"] -= 1
        if not _stops_held["depth"]:
            signum, _stops_held["signum"] = _stops_held["signum"], None
    if signum is not None:
        _terminate(signum)


def stop_on(name):
    """Also stop cleanly on SIG<name> (USR1 or USR2), as on SIGTERM; None adds nothing.
    Call it from main(), inside run_cli, which puts the handlers back when main ends."""
    if name:
        signal.signal(getattr(signal, f"SIG{name}"), _raise_terminated)


def run_cli(main, argv=None, finish=None):
    """Run main(), then finish() if given, however main() ended (a port's leaving of its
    job, which must happen before the interpreter exits); turn a TrainerError, a peer's
    failure, Ctrl-C or a stop signal into one line on stderr and an exit status."""
    argv = sys.argv[1:] if argv is None else argv
    prog = os.path.basename(sys.argv[0] or "main.py")
    where = f" (rank {launcher_rank()})" if launched() else ""
    stops = [getattr(signal, f"SIG{name}") for name in STOP_SIGNALS]
    previous = {signum: signal.getsignal(signum) for signum in stops}
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        return _exit_status(main, argv, finish, prog, where)
    finally:  # the handlers as they were before, for a caller that goes on
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def say(line):
    """One line to stderr in one write: print() writes the text and its newline apart, and a
    launcher or another rank sharing the stream (torchrun's agent, srun's output file) can
    write between the two."""
    sys.stderr.write(redact(line) + "\n")
    sys.stderr.flush()


# How long another rank waits for rank 0 to say an error that every rank met (below).
RANK0_GRACE_S = 10.0


def _let_rank0_say_it(code):
    """Another rank that met an error every rank meets waits for its launcher to end it (it
    does once rank 0 has said the error and exited), up to RANK0_GRACE_S, and then exits
    with the same status, quietly. Exiting at once, it could be first: torchrun and mpirun
    then end every other rank, rank 0 too, maybe before rank 0 has said anything (a usage
    error found while rank 0 was still importing torch). Not where MPI is initialized
    (_in_mpi), nor under horovodrun's elastic driver (_in_elastic_driver)."""
    for name in STOP_SIGNALS:
        signal.signal(getattr(signal, f"SIG{name}"), lambda *_: os._exit(code))
    time.sleep(RANK0_GRACE_S)


def _in_mpi():
    """Whether this process is a rank of an MPI job of several (mpi4py, or Horovod on its MPI
    controller). Its ranks then leave together, in MPI_Finalize at exit, after rank 0 has
    spoken; and mpirun does not end a rank for another's clean exit, so a wait would run its
    full time. An MPI world of one (mpi4py under horovodrun --gloo starts one for each process)
    holds nobody back: there the rank waits for rank 0 as under any other launcher."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return mpi.COMM_WORLD.Get_size() > 1
    hvd = sys.modules.get("horovod.torch")
    return hvd is not None and hvd.is_initialized() and hvd.mpi_enabled()


def _in_elastic_driver():
    """Whether horovodrun's elastic driver started this process. It ends no worker for another's
    exit: it waits until every worker has ended, rank 0 too, after it has spoken, so a wait
    there would run its full time."""
    return os.environ.get("HOROVOD_ELASTIC") == "1" and "HOROVOD_GLOO_RENDEZVOUS_ADDR" in os.environ


def _exit_status(main, argv, finish, prog, where):
    try:
        try:
            main(argv)
        finally:  # no stop signal may interrupt the finish or the one-line exits below
            _ignore_stop_signals()
            if finish:
                finish()
        return 0
    except TrainerError as e:
        if "--debug" in argv:
            raise
        # An error every rank meets alike (a usage error, a divergence) is said by rank 0
        # alone; others may be one rank's alone, so each says which rank it is.
        if not e.every_rank:
            say(f"{prog}: error{where}: {e}")
        elif launcher_rank() == 0:
            say(f"{prog}: error: {e}")
        elif launched() and not _in_mpi() and not _in_elastic_driver():
            _let_rank0_say_it(e.exit_code)
        return e.exit_code
    except Exception as e:
        # A collective fails on the surviving ranks when another rank failed or died, which
        # has said why; or on every rank alike (an NCCL error, a timeout), when no rank has:
        # each names the failure, so that at least one line holds the cause.
        if not peer_failed(e) or "--debug" in argv:
            raise
        say(f"{prog}: error{where}: {PEER_FAILED}: {cause(e)} ({PEER_HINT})")
        return 1
    except KeyboardInterrupt as e:  # Ctrl-C, or a stop signal
        # (128 + its number, as shells report it)
        signum = e.signum if isinstance(e, Terminated) else signal.SIGINT
        how = f" by {signal.Signals(signum).name}" if isinstance(e, Terminated) else ""
        say(f"{prog}: interrupted{where}{how}; the last finished epoch is in the checkpoint")
        return 128 + signum
