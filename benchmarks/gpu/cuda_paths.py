"""BatchNorm averaging and the divergence guard on CUDA tensors, through Horovod's NCCL allreduce.

    horovodrun -np 1 --gloo python -m benchmarks.gpu.cuda_paths

One GPU holds one rank (NCCL refuses two on one device), so the second rank of
utils.average_batchnorm is another model's statistics, added to the real hvd.allreduce of
this one's: the result must be the mean of the two, in every BatchNorm buffer, on the GPU.
divergence.check_epoch must pass the finite model and stop (Diverged) on one weight made nan,
with the reduction through Horovod as in training. Prints one line per check; exit status 1 if
any failed.
"""
import sys

import torch

import models
from training.base.errors import Diverged
from training.run import divergence
import utils


def bn_stats(model):
    return {n: b.clone() for n, b in model.named_buffers() if n.endswith(("running_mean", "running_var"))}


def trained_stats(seed):
    torch.manual_seed(seed)
    model = models.get_model("resnet18").cuda().train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(64, 3, 32, 32, device="cuda") * (1 + seed))
    return model


def main():
    import horovod.torch as hvd
    hvd.init()
    torch.cuda.set_device(hvd.local_rank())
    ok = True
    mine, other = trained_stats(0), trained_stats(1)
    a, b = bn_stats(mine), bn_stats(other)
    flat_other = torch.cat([b[n].double().flatten() for n in a])

    def allreduce(t):  # this rank's sum through NCCL, plus a second rank holding `other`'s statistics
        return hvd.allreduce(t, op=hvd.Sum) + flat_other
    world = utils.World(rank=hvd.rank(), size=2, allreduce=allreduce)
    utils.average_batchnorm(mine, world)
    after = bn_stats(mine)
    worst = max(((after[n].double() - (a[n].double() + b[n].double()) / 2).abs().max().item() for n in a))
    good = all(after[n].is_cuda for n in a) and worst < 1e-6 and len(a) > 0
    print(f"cuda-paths: average_batchnorm over {len(a)} CUDA buffers through NCCL: largest error {worst:.2e}"
          f" ({'ok' if good else 'FAILED'})", flush=True)
    ok &= good

    one = utils.World(rank=hvd.rank(), size=hvd.size(), allreduce=lambda t: hvd.allreduce(t, op=hvd.Sum))
    fine = {"loss": 1.0, "acc": 0.5, "images": 10}
    try:
        divergence.check_epoch(mine, {"lr": 0.1}, fine, 0, one)
        passed = True
    except Diverged:
        passed = False
    with torch.no_grad():
        next(mine.parameters()).view(-1)[0] = float("nan")
    try:
        divergence.check_epoch(mine, {"lr": 0.1}, fine, 0, one)
        stopped = ""
    except Diverged as e:
        stopped = str(e)
    good = passed and "weights became non-finite" in stopped
    print(f"cuda-paths: check_epoch on CUDA weights: finite passes {passed}, a nan weight stops it: "
          f"{bool(stopped)} ({'ok' if good else 'FAILED'})", flush=True)
    ok &= good
    hvd.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
