"""cli.py in process: the recipe behind the defaults, the flag checks, launcher ranks, SIGTERM."""
import os
import signal
import time

import pytest

import cli
import safeio
from errors import UsageError


def parse(*argv, horovod=False):
    parser = cli.build_parser("")
    if horovod:
        cli.add_horovod_args(parser)
    return cli.parse_args(parser, list(argv))


def test_defaults_come_from_the_recipe():
    args = parse(horovod=True)
    assert (args.epochs, args.batch_size, args.warmup_epochs) == (
        cli.RECIPE["epochs"], cli.RECIPE["batch_size"], cli.RECIPE["warmup_epochs"])
    assert args.lr is None  # fresh runs take RECIPE["lr"]; a resume keeps the saved schedule
    assert f"default: {cli.RECIPE['lr']} on a fresh run" in " ".join(cli.build_parser("").format_help().split())


@pytest.mark.parametrize("argv, needle", [
    (["--epochs", "0"], "--epochs must be positive"),
    (["--lr", "nan"], "--lr must be a positive number"),
    (["--stop-at", "9", "--epochs", "3"], "--stop-at must be between 1 and --epochs 3"),
    (["--arch", "resnet9000"], "unknown --arch"),
    (["--resume", "--overwrite"], "pick one"),
    (["--batch-size", "x"], "invalid int value"),
])
def test_bad_flags_are_usage_errors(argv, needle):
    with pytest.raises(UsageError, match=needle.replace("-", r"\-")):
        parse(*argv)


def test_port_flags_are_checked_only_where_the_parser_has_them():
    with pytest.raises(UsageError, match="--batches-per-allreduce must be positive"):
        parse("--batches-per-allreduce", "0", horovod=True)
    with pytest.raises(UsageError, match="unrecognized arguments"):
        parse("--batches-per-allreduce", "2")  # main.py has no such flag


def test_adasum_needs_mpi_and_a_power_of_two():
    args = parse("--use-adasum", horovod=True)
    cli.check_adasum(args, 4, mpi_enabled=True)
    with pytest.raises(UsageError, match="MPI controller"):
        cli.check_adasum(args, 4, mpi_enabled=False)
    with pytest.raises(UsageError, match="power-of-two number of processes, not 3"):
        cli.check_adasum(args, 3, mpi_enabled=True)


def test_launcher_rank_reads_the_launchers_variables(monkeypatch):
    for var in cli.LAUNCHER_RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    assert cli.launcher_rank() == 0
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    assert cli.launcher_rank() == 3


def test_compile_modes():
    import torch
    import utils
    assert parse().compile is None and parse("--compile").compile == "auto"
    assert utils.compile_mode(parse("--compile"), torch.device("cuda")) == "reduce-overhead"
    assert utils.compile_mode(parse("--compile"), torch.device("cpu")) == "default"
    assert utils.compile_mode(parse("--compile", "max-autotune-no-cudagraphs"), torch.device("cuda")) == \
        "max-autotune-no-cudagraphs"
    if not torch.cuda.is_available():  # CUDA graphs need CUDA: a one-line usage error
        with pytest.raises(UsageError, match="--compile reduce-overhead captures CUDA graphs and needs CUDA"):
            parse("--compile", "reduce-overhead")
    with pytest.raises(UsageError, match="invalid choice"):
        parse("--compile", "fastest")


def test_sigterm_during_a_save_is_one_line_and_leaves_the_old_file(tmp_path, capsys, monkeypatch):
    """A real SIGTERM in the middle of an atomic write: exit 143 with one line, the old
    file whole, no temporary left, and SIGTERM's handling as it was before."""
    for var in cli.LAUNCHER_RANK_VARS:
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
    code = cli.run_cli(lambda argv: safeio.atomic_write(str(path), write), argv=[])
    assert code == 143 and time.monotonic() - t0 < 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].endswith(": interrupted by SIGTERM; the last finished epoch is in the checkpoint"), err
    assert path.read_bytes() == b"the previous checkpoint"
    assert os.listdir(tmp_path) == ["ckpt.pth"]
    assert signal.getsignal(signal.SIGTERM) == before


def test_shared_distributed_flags_mean_the_same_in_both_ports():
    hvd = cli.parse_args(cli.add_horovod_args(cli.build_parser("")), ["--batches-per-allreduce", "2"])
    ddp = cli.parse_args(cli.add_ddp_args(cli.build_parser("")), ["--batches-per-allreduce", "2"])
    shared = ("warmup_epochs", "batches_per_allreduce", "sync_bn")
    assert {k: getattr(hvd, k) for k in shared} == {k: getattr(ddp, k) for k in shared}
    assert hvd.fp16_allreduce is False and not hasattr(ddp, "fp16_allreduce")
    with pytest.raises(UsageError, match="--batches-per-allreduce must be positive"):
        cli.parse_args(cli.add_ddp_args(cli.build_parser("")), ["--batches-per-allreduce", "0"])


def test_peer_failures_are_recognised_by_name_and_message(monkeypatch):
    gloo = RuntimeError("[/x/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
                        "[127.0.0.1]:46755: Connection reset by peer")
    assert cli.peer_failed(gloo)
    assert cli.peer_failed(type("HorovodInternalError", (RuntimeError,), {})("x"))
    assert cli.peer_failed(type("DistBackendError", (RuntimeError,), {})("x"))
    assert not cli.peer_failed(RuntimeError("shape mismatch")) and not cli.peer_failed(ValueError("gloo/transport/"))
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert cli.torchrun_local() == (1, 3)


def test_finish_runs_after_main_and_not_after_an_error(capsys):
    done = []
    assert cli.run_cli(lambda argv: None, argv=[], finish=lambda: done.append(1)) == 0 and done == [1]
    def fail(argv):
        raise UsageError("bad")
    assert cli.run_cli(fail, argv=[], finish=lambda: done.append(2)) == 2 and done == [1]
