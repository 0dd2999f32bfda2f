"""launch.py: launcher ranks, peer failures, SIGTERM and the one-line exits, in process; and
real two-rank jobs whose every rank fails alike, under torchrun and horovodrun."""
import os
import re
import signal
import time

import pytest

from helpers import BIN, PY, horovod_cmd, run
from training.base import safeio
from training.base.errors import UsageError
from training.run import launch


def test_launcher_rank_reads_the_launchers_variables(monkeypatch):
    for var in launch.LAUNCHER_RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    assert launch.launcher_rank() == 0
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    assert launch.launcher_rank() == 3


def test_torchrun_local(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert launch.torchrun_local() == (1, 3)


def test_sigterm_during_a_save_is_one_line_and_leaves_the_old_file(tmp_path, capsys, monkeypatch):
    """A real SIGTERM in the middle of an atomic write: exit 143 with one line, the old
    file whole, no temporary left, and SIGTERM's handling as it was before."""
    for var in launch.LAUNCHER_RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    path = tmp_path / "ckpt.pth"
    path.write_bytes(b"the previous checkpoint")

    def write(f):
        f.write(b"half of a new checkpoint")
        f.flush()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here, at once
        f.write(b"never written")

    before = signal.getsignal(signal.SIGTERM)
    t0 = time.monotonic()
    code = launch.run_cli(lambda argv: safeio.atomic_write(str(path), write), argv=[])
    assert code == 143 and time.monotonic() - t0 < 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].endswith(": interrupted by SIGTERM; the last finished epoch is in the checkpoint"), err
    assert path.read_bytes() == b"the previous checkpoint"
    assert os.listdir(tmp_path) == ["ckpt.pth"]
    assert signal.getsignal(signal.SIGTERM) == before


def test_peer_failures_are_recognised_by_name_and_message():
    gloo = RuntimeError("[/x/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
                        "[127.0.0.1]:46755: Connection reset by peer")
    assert launch.peer_failed(gloo)
    assert launch.peer_failed(type("HorovodInternalError", (RuntimeError,), {})("x"))
    assert launch.peer_failed(type("DistBackendError", (RuntimeError,), {})("x"))
    assert not launch.peer_failed(RuntimeError("shape mismatch"))
    assert not launch.peer_failed(ValueError("gloo/transport/"))


def test_the_cause_of_a_failed_collective_is_its_first_line():
    gloo = RuntimeError("[/x/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
                        "waiting 3000ms for recv operation to complete\nmore")
    assert launch.cause(gloo) == "Timed out waiting 3000ms for recv operation to complete"
    assert launch.cause(RuntimeError("")) == "RuntimeError"
    assert launch.cause(RuntimeError("x" * 500)) == "x" * 297 + "..."


@pytest.mark.parametrize("port", ["ddp", "horovod"])
def test_a_failure_every_rank_meets_alike_is_said_with_its_cause(port):
    """No rank fails first, so no rank's error is above the others': a rank that ends on the
    failed collective says so in one line, and at least one names its cause (the other may
    instead meet the first one's leaving, or be stopped by the launcher once the first has
    ended, which on a loaded machine can come before its own failure), with no traceback; the
    job ends non-zero."""
    probe = os.path.join("tests", "probes", "fail_alike.py")
    cmd = ([os.path.join(BIN, "torchrun"), "--standalone", "--nproc_per_node", "2", probe, "ddp"]
           if port == "ddp" else
           [os.path.join(BIN, "horovodrun"), "-np", "2", "--gloo", PY, probe, "horovod"])
    r = run(cmd, timeout=120)
    cause = {"ddp": "Timed out waiting 3000ms for recv operation to complete",
             "horovod": "Mismatched ALLREDUCE tensor shapes"}[port]
    said = dict(re.findall(rf"fail_alike\.py: error \(rank (\d)\): {launch.PEER_FAILED}: (.*) "
                           rf"\({launch.PEER_HINT}\)", r.stderr + r.stdout))
    assert r.returncode != 0 and said and set(said) <= {"0", "1"}, r.stderr[-3000:]
    assert any(text.startswith(cause) for text in said.values()), said
    # (the launchers print tracebacks of their own: torchrun's ChildFailedError, horovodrun's)
    assert not re.search(r"\[rank\d\]: Traceback|\]<stderr>:Traceback", r.stderr), r.stderr[-3000:]


@pytest.mark.parametrize("launcher", ["torchrun", "mpirun"])
def test_an_error_every_rank_meets_is_said_by_rank0_when_another_rank_meets_it_first(launcher):
    """Rank 1 meets the usage error three seconds before rank 0. Had it exited at once, the
    launcher would have ended rank 0 before rank 0 said anything (both cases fail so); it
    waits to be ended."""
    probe = os.path.join("tests", "probes", "fail_alike.py")
    cmd = ([os.path.join(BIN, "torchrun"), "--standalone", "--nproc_per_node", "2", probe, "usage"]
           if launcher == "torchrun" else horovod_cmd(2, ["usage"], "mpirun", script=probe))
    r = run(cmd, timeout=120)
    said = re.findall(r"fail_alike\.py: error.*", r.stderr + r.stdout)
    assert r.returncode != 0 and said == ["fail_alike.py: error: --epochs must be positive (got 0)"], \
        (r.stdout + r.stderr)[-3000:]


def test_finish_runs_however_main_ended(capsys):
    # A port's leaving of its job (process_group.leave_job) must run before the interpreter exits,
    # whether main() returned, failed or was stopped by a signal.
    done = []
    assert launch.run_cli(lambda argv: None, argv=[], finish=lambda: done.append("returned")) == 0

    def fail(argv):
        raise UsageError("bad")
    assert launch.run_cli(fail, argv=[], finish=lambda: done.append("failed")) == 2

    def stopped(argv):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert launch.run_cli(stopped, argv=[], finish=lambda: done.append("stopped")) == 143
    assert done == ["returned", "failed", "stopped"]


def _only(monkeypatch, **env):
    for var in launch.LAUNCHER_RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)


def test_another_rank_waits_for_rank0_only_where_its_launcher_would_end_it(capsys, monkeypatch):
    """Rank 1 meeting an error every rank meets: under torchrun it waits (RANK0_GRACE_S) for
    torchrun to end it once rank 0 has spoken; under horovodrun's elastic driver, which ends no
    worker for another's exit, it returns at once. Quietly, either way."""
    def fail(argv):
        raise UsageError("bad")
    waits = []
    monkeypatch.setattr(launch.time, "sleep", waits.append)  # the wait recorded, not slept
    _only(monkeypatch, RANK="1")
    assert launch.run_cli(fail, argv=[]) == 2 and waits == [launch.RANK0_GRACE_S]
    waits.clear()
    _only(monkeypatch, HOROVOD_RANK="1", HOROVOD_ELASTIC="1", HOROVOD_GLOO_RENDEZVOUS_ADDR="127.0.0.1")
    assert launch.run_cli(fail, argv=[]) == 2 and waits == []
    assert capsys.readouterr().err == ""


def test_launcher_rank_in_the_order_slurm_needs(monkeypatch):
    _only(monkeypatch, PMIX_RANK="3", SLURM_PROCID="3")  # srun --mpi=pmix: no OMPI_ variables
    assert launch.launcher_rank() == 3
    _only(monkeypatch, OMPI_COMM_WORLD_RANK="1", PMIX_RANK="1", SLURM_PROCID="0")  # mpirun in sbatch
    assert launch.launcher_rank() == 1
    _only(monkeypatch, RANK="5", SLURM_PROCID="1")  # srun torchrun: one Slurm task per node
    assert launch.launcher_rank() == 5
    _only(monkeypatch, SLURM_PROCID="2")  # srun of a plain script
    assert launch.launcher_rank() == 2 and launch.launched()
    _only(monkeypatch)
    assert launch.launcher_rank() == 0 and not launch.launched()


def test_the_stop_signal_ends_with_one_line_and_its_status(capsys, monkeypatch):
    """--stop-signal USR2: a real SIGUSR2 ends main() as SIGTERM does, exit 128 + 12, one line;
    afterwards every stop signal's handler is as it was."""
    _only(monkeypatch, SLURM_PROCID="1")
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)}

    def main(argv):
        launch.stop_on("USR2")
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(5)  # the handler raises here, at once

    t0 = time.monotonic()
    assert launch.run_cli(main, argv=[]) == 128 + signal.SIGUSR2 and time.monotonic() - t0 < 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(
        ": interrupted (rank 1) by SIGUSR2; the last finished epoch is in the checkpoint"), err
    assert {s: signal.getsignal(s) for s in before} == before
    launch.stop_on(None)  # nothing to add
    assert {s: signal.getsignal(s) for s in before} == before


def test_more_stop_signals_do_not_cut_a_stop_short(capsys, monkeypatch):
    """Slurm signals every task and step, and torchrun's agent sends SIGTERM after a worker's
    USR2: once a stop is under way, later stop signals change nothing."""
    _only(monkeypatch)

    def main(argv):
        launch.stop_on("USR2")
        try:
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(5)
        finally:  # the stop under way (a save's clean-up, say) while more signals arrive
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(0.2)

    assert launch.run_cli(main, argv=[]) == 128 + signal.SIGUSR2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "interrupted by SIGUSR2" in err[0], err


def test_a_stop_signal_waits_for_the_held_section_then_stops(capsys, monkeypatch):
    """A SIGTERM while the epoch's checkpoint and metrics row are saved: both are written,
    then the run stops with the same one line and status."""
    _only(monkeypatch)
    written = []

    def main(argv):
        with launch.stops_held():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the handler has run by now, and held the stop
            written.append("checkpoint")
            written.append("metrics row")
        written.append("next epoch")  # never reached

    assert launch.run_cli(main, argv=[]) == 143
    assert written == ["checkpoint", "metrics row"]
    err = capsys.readouterr().err.strip().splitlines()
    said = ": interrupted by SIGTERM; the last finished epoch is in the checkpoint"
    assert len(err) == 1 and err[0].endswith(said), err
    # Outside a held section the stop is at once again.
    with launch.stops_held():
        pass
    assert launch.run_cli(lambda argv: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(5)), argv=[]) == 143


def test_an_error_in_the_held_section_is_reported_and_clears_the_held_stop(capsys, monkeypatch):
    _only(monkeypatch)

    def main(argv):
        with launch.stops_held():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            raise UsageError("the disk is full")

    assert launch.run_cli(main, argv=[]) == 2
    assert "the disk is full" in capsys.readouterr().err
    with launch.stops_held():  # nothing left over from the section before
        pass
