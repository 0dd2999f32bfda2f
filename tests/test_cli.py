"""cli.py in process: the flags and their checks (the recipe behind the defaults: test_recipe.py)."""
import pytest

from helpers import parse
from sweeps import flags
from training.base.errors import UsageError
from training.run import cli


@pytest.mark.parametrize("argv, needle", [
    (["--epochs", "0"], "--epochs must be positive"),
    (["--cutout", "33"], "--cutout is a side in pixels between 0"),
    (["--cutout", "8", "--loader", "torchvision"], "--cutout is done by the device loader"),
    (["--lr-schedule", "step"], "invalid choice"),
    (["--lr", "nan"], "--lr must be a positive number"),
    (["--stop-at", "9", "--epochs", "3"], "--stop-at must be between 1 and --epochs 3"),
    (["--arch", "resnet9000"], "unknown --arch"),
    (["--resume", "--overwrite"], "pick one"),
    (["--auto-resume", "--resume"], "pick one"),
    (["--auto-resume", "--evaluate"], "do not go together"),
    (["--stop-signal", "HUP"], "invalid choice"),
    (["--target-acc", "94"], "--target-acc is a fraction of the test set between 0 and 1"),
    (["--batch-size", "x"], "invalid int value"),
    (["--label-smoothing", "1"], "--label-smoothing must be at least 0 and below 1"),
    (["--recipe", "slow"], "invalid choice"),
    (["--batch-size", "-4"], "--batch-size must be positive"),
    (["--lr", "0"], "--lr must be a positive number"),
    (["--dataset", "imagenet"], "invalid choice"),
])
def test_bad_flags_are_usage_errors(argv, needle):
    with pytest.raises(UsageError, match=needle.replace("-", r"\-")):
        parse(*argv)


def test_port_flags_are_checked_only_where_the_parser_has_them():
    with pytest.raises(UsageError, match="--batches-per-allreduce must be positive"):
        parse("--batches-per-allreduce", "0", port="horovod")
    with pytest.raises(UsageError, match="--batches-per-allreduce must be positive"):
        parse("--batches-per-allreduce", "0", port="ddp")
    import torch
    if not torch.cuda.is_available():
        for port in ("horovod", "ddp"):
            with pytest.raises(UsageError, match="--sync-bn needs CUDA"):
                parse("--sync-bn", port=port)
    with pytest.raises(UsageError, match="unrecognized arguments"):
        parse("--batches-per-allreduce", "2")  # main.py has no such flag


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


@pytest.mark.parametrize("port", ["horovod", "ddp"])
def test_compile_without_cuda_graphs_when_gradients_accumulate(port):
    import torch

    import utils
    k2 = parse("--compile", "--batches-per-allreduce", "2", port=port)
    assert utils.compile_mode(k2, torch.device("cuda")) == "max-autotune-no-cudagraphs"
    assert utils.compile_mode(k2, torch.device("cpu")) == "default"
    assert utils.compile_mode(parse("--compile", port=port), torch.device("cuda")) == "reduce-overhead"
    for mode in ("reduce-overhead", "max-autotune"):  # named, with k > 1: one line, on any machine
        with pytest.raises(UsageError, match=f"--compile {mode} captures CUDA graphs, whose gradients"):
            parse("--compile", mode, "--batches-per-allreduce", "2", port=port)


def test_shared_distributed_flags_mean_the_same_in_both_ports():
    hvd = parse("--batches-per-allreduce", "2", port="horovod")
    ddp = parse("--batches-per-allreduce", "2", port="ddp")
    shared = ("warmup_epochs", "batches_per_allreduce", "sync_bn")
    assert {k: getattr(hvd, k) for k in shared} == {k: getattr(ddp, k) for k in shared}
    assert hvd.fp16_allreduce is False and ddp.fp16_allreduce is False  # one flags object


def test_every_trainer_has_every_field_the_engine_reads():
    # Fields a trainer has no flag for hold the value that means "not used", so the engine
    # reads args.X under any trainer; a port's own flags set them.
    main, hvd = parse(), parse("--warmup-epochs", "2", "--batches-per-allreduce", "3", port="horovod")
    assert {k: getattr(main, k) for k in cli.NOT_USED} == cli.NOT_USED
    assert (hvd.warmup_epochs, hvd.batches_per_allreduce) == (2.0, 3)
    with pytest.raises(UsageError, match="unrecognized arguments: --warmup-epochs"):
        parse("--warmup-epochs", "2")  # a field is not a flag of main.py's
    with pytest.raises(UsageError, match="--batches-per-allreduce must be positive"):
        parse("--batches-per-allreduce", "0", port="ddp")


def test_elastic_refuses_what_an_elastic_job_cannot_do():
    assert parse("--warmup-epochs", "1", port="elastic").warmup_epochs == 1
    with pytest.raises(UsageError, match="main_elastic.py only trains"):
        parse("--evaluate", port="elastic")
    with pytest.raises(UsageError, match="--use-adasum needs Horovod's MPI controller"):
        parse("--use-adasum", port="elastic")
    with pytest.raises(UsageError, match="main_elastic.py reduces gradients from backward's hooks only"):
        parse("--grad-allreduce", "one", port="elastic")


@pytest.mark.parametrize("argv, needle", [
    (["--grad-allreduce", "one", "--use-adasum"], "--use-adasum and --allreduce-groups work per tensor"),
    (["--grad-allreduce", "one", "--allreduce-groups", "2"], "work per tensor: drop one of them"),
    (["--grad-allreduce", "regions"], "compiles the model block by block: add --compile"),
    (["--grad-allreduce", "all"], "invalid choice"),
])
def test_a_gradient_path_that_cannot_work_is_one_line(argv, needle):
    with pytest.raises(UsageError, match=needle.replace("-", r"\-")):
        parse(*argv, port="horovod")


def test_auto_picks_the_gradient_path_from_compile_hosts_and_per_tensor_flags(monkeypatch):
    import horovod.torch as hvd

    from training.ports import hvd_port
    hosts = {"n": 1}
    monkeypatch.setattr(hvd, "cross_size", lambda: hosts["n"])
    assert hvd_port.grad_path(parse(port="horovod")) == "hooks"  # eager: the hooks overlap backward
    assert hvd_port.grad_path(parse("--compile", port="horovod")) == "one"
    assert hvd_port.grad_path(parse("--compile", "--allreduce-groups", 2, port="horovod")) == "regions"
    assert hvd_port.grad_path(parse("--compile", "--grad-allreduce", "hooks", port="horovod")) == "hooks"
    hosts["n"] = 2
    assert hvd_port.grad_path(parse("--compile", port="horovod")) == "regions"
    assert hvd_port.grad_path(parse(port="horovod")) == "hooks"


def test_synthetic_size_is_checked_once_for_flags_and_generator(tmp_path):
    from training.run import data
    for bad in ("7", "0"):
        with pytest.raises(UsageError, match="--synthetic-size must be a positive multiple of 5"):
            parse("--synthetic-size", bad)
    with pytest.raises(UsageError, match="multiple of 5"):
        data.generate_synthetic(str(tmp_path), 7, 2, seed=0)


def test_arch_takes_pytorch_cifars_spelling():
    assert parse("--arch", "ResNet18").arch == "resnet18"
    assert parse("--arch", "PreActResNet18").arch == "preactresnet18"
    assert parse("--arch", "RegNetX_200MF").arch == "regnetx_200mf"
    assert "{resnet18" not in cli.build_parser("").format_help()  # --help: one spelling, no choices list


def test_sweep_lists_and_their_checks():
    args = parse("--sweep", "lr=0.05,0.1", "--sweep=seed=0,1,2", port="sweep")
    assert args.sweep == [("lr", ["0.05", "0.1"]), ("seed", ["0", "1", "2"])]
    for argv, needle in [(["--sweep", "momentum=0.8,0.9"], "FLAG one of lr, seed, batch-size"),
                         (["--sweep", "lr"], "FLAG=V1,V2"),
                         (["--sweep", "lr=0.1,"], "FLAG=V1,V2"),
                         (["--sweep", "lr=0.1", "--sweep", "lr=0.2"], "each --sweep FLAG may come once"),
                         (["--sweep", "lr=0.1,0.2", "--evaluate"], "evaluate a run with main.py --evaluate")]:
        with pytest.raises(UsageError, match=needle) as raised:
            parse(*argv, port="sweep")
        assert "main_sweep.py's" not in str(raised.value)  # its own error sends nowhere else
    for port in ("horovod", "elastic", "ddp", None):  # --sweep is main_sweep.py's alone
        with pytest.raises(UsageError, match="unrecognized arguments: --sweep .*--sweep is main_sweep.py's: "):
            parse("--sweep", "lr=0.1,0.2", port=port)


def test_weight_decay_is_a_flag_whose_default_is_the_recipes():
    assert parse("--weight-decay", "1e-3").weight_decay == 1e-3 and parse("--weight-decay", "0").weight_decay == 0
    with pytest.raises(UsageError, match="--weight-decay must be 0 or more"):
        parse("--weight-decay", "-1")
    assert parse("--sweep", "weight-decay=0,5e-4", port="sweep").sweep == [("weight-decay", ["0", "5e-4"])]


def test_a_sweeps_runs_get_every_flag_but_main_sweeps_own():
    argv = ["--arch", "lenet", "--sweep", "lr=0.1,0.2", "--ranks-per-run=1", "--sweep=seed=0,1", "--epochs", "3",
            "--ranks-per-run", "2"]
    assert flags.run_flags(argv) == ["--arch", "lenet", "--epochs", "3"]


def test_search_axes_and_their_checks():
    args = parse("--search", "lr=log:0.01:1", "--search=batch-size=16:64", "--search", "arch=lenet,vgg11",
                 "--trials", "5", port="sweep")
    assert [tuple(a) for a in args.search] == [("lr", "log", (0.01, 1.0)), ("batch-size", "uniform", (16, 64)),
                                               ("arch", "choice", ("lenet", "vgg11"))]
    assert (args.trials, args.pruner, args.sampler) == (5, "median", "tpe")
    for argv, needle in [(["--search", "momentum=0.8:0.9"], "FLAG one of lr, weight-decay"),
                         (["--search", "lr=1:0.1"], "lr=1:0.1 is not a range; give lr=LO:HI or lr=log:LO:HI"),
                         (["--search", "lr=0.1:x"], "is not a range"),
                         (["--search", "lr=0.1:0.2:0.3"], "is not a range"),
                         (["--search", "batch-size=16:64.5"], "two integers with LO below HI"),
                         (["--search", "lr=log:0:1"], "a log range starts above 0"),
                         (["--search", "arch=1:3"], "arch takes a list of values"),
                         (["--search", "lr=0.1"], "one value is no search; pass --lr 0.1"),
                         (["--search", "lr=0.1:1", "--search", "lr=log:0.1:1"], "each --search FLAG may come once"),
                         (["--search", "lr=0.1:1"], "--search needs --trials N"),
                         (["--search", "lr=0.1:1", "--trials", "0"], r"--trials must be positive \(got 0\)"),
                         (["--trials", "4"], "--trials counts the trials of a --search"),
                         (["--search", "lr=0.1:1", "--trials", "4", "--sweep", "seed=0,1"], "do not go together"),
                         (["--search", "lr=0.1:1", "--trials", "4", "--stop-at", "1"], "drop --stop-at"),
                         (["--search", "lr=0.1:1", "--trials", "4", "--overwrite"], "resumes its study by itself")]:
        with pytest.raises(UsageError, match=needle):
            parse(*argv, port="sweep")
    with pytest.raises(UsageError, match="--search is main_sweep.py's: "):
        parse("--search", "lr=0.1:1", port="horovod")
