"""--compile: the compiled step gives the eager step's results, with Horovod's gradient hooks on.

On a GPU, --compile captures CUDA graphs (reduce-overhead). The CPU has none, so here
torch.compile's default mode (Inductor's generated C++) stands in: the same compiled
forward and backward, with DistributedOptimizer's hooks firing after the compiled backward
(HOROVOD_ELASTIC=1 registers them at np=1, as at every np >= 2) and --batches-per-allreduce 2
accumulating two compiled backward passes per allreduce (reduce-overhead with gradient
accumulation has wrong-result reports on GPUs, pytorch #169545: this is the CPU half of it).
Tolerance: every weight within 1e-4 of its tensor's largest value after 8 steps: Inductor sums
in another order, and where max-pooling meets a tie (zero padding makes them) it may route the
gradient to another of the equal inputs, a gradient as valid as eager's.

Under DDP the wrapper is compiled, not the model (utils.training_model): at np=2 with
--batches-per-allreduce 2 and an epoch whose last step is smaller (its second pass eager, through
the same wrapper), its weights equal, bit for bit, those of the Horovod port compiled alike, on
the two paths --compile picks (--grad-allreduce one and regions: training/ports/hvd_port.py).
"""
import torch

from helpers import (
    PY,
    assert_ok,
    assert_states_equal,
    common_args,
    load_ckpt,
    parse,
    read_metrics,
    run,
    run_ddp,
    run_horovod,
)
import utils


def test_compiled_step_with_hooks_and_accumulation_equals_eager(data_dir, tmp_path):
    runs = {}
    for name, extra in (("eager", []), ("compiled", ["--compile"])):
        args = common_args(data_dir, tmp_path / name, "--batches-per-allreduce", 2, "--warmup-epochs", 0,
                           *extra, epochs=1)
        r = assert_ok(run([PY, "main_horovod.py", *args], env_extra={"HOROVOD_ELASTIC": "1"}, timeout=400))
        runs[name] = load_ckpt(tmp_path / name / "ckpt.pth")["model"]
        assert read_metrics(tmp_path / name)[0]["world_size"] == "1", r.stdout
    assert_states_equal(runs["eager"], runs["compiled"], "eager and compiled", atol_scale=1e-4)
    # ...and training moved them: the comparison is not of two untouched inits.
    init = utils.build_model(parse("--arch", "lenet"), torch.device("cpu"))
    assert not torch.equal(init.state_dict()["conv1.weight"], runs["eager"]["conv1.weight"])


def test_ddp_compiles_its_wrapper_and_equals_horovod_compiled_on_the_paths_compile_picks(data_dir, tmp_path):
    # 250 images a rank in steps of 2 x 32: three whole steps, then 32 + 26
    args = ["--batches-per-allreduce", 2, "--warmup-epochs", 0, "--compile"]
    ddp = assert_ok(run_ddp(2, common_args(data_dir, tmp_path / "ddp", *args, epochs=1), timeout=400))
    assert read_metrics(tmp_path / "ddp")[0]["world_size"] == "2", ddp.stdout
    want = load_ckpt(tmp_path / "ddp" / "ckpt.pth")["model"]
    # Horovod's paths that --compile picks: one allreduce of all gradients (auto's pick on one
    # host) and the model compiled block by block (across hosts). The per-tensor hooks after the
    # compiled backward are the test above's, against eager.
    for path in ("one", "regions"):
        folder = tmp_path / path
        assert_ok(run_horovod(2, common_args(data_dir, folder, *args, "--grad-allreduce", path, epochs=1),
                              timeout=400))
        assert_states_equal(want, load_ckpt(folder / "ckpt.pth")["model"], f"DDP and Horovod's {path}")
