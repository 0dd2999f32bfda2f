"""Training steps of every registered model under a port, at the launcher's world size.

    torchrun --standalone --nproc_per_node 2 tests/probes/every_model.py ddp [NAME ...]
    horovodrun -np 2 --gloo python tests/probes/every_model.py horovod [NAME ...]
    horovodrun -np 2 --gloo python tests/probes/every_model.py horovod-one [NAME ...]

One process group for the whole registry: each model is wrapped as its trainer wraps it
(process_group.distributed_model, hvd_port.distributed_optimizer, with the weights' broadcast
of a fresh Horovod run), takes SGD steps (two under DDP, one under Horovod) on this rank's
own random batch of 2, and then every rank compares a checksum of each weight with rank 0's.
Rank 0 prints `NAME ok` for a model whose every parameter but those listed in STILL got a
non-zero averaged gradient (a weight's movement would not show it: weight decay alone moves
every weight), whose weights moved, stayed finite and are the same on every rank; else
`NAME FAILED: why`. `horovod-one` wraps it as --grad-allreduce one does (every gradient in one
allreduce), and a model also fails there unless its reduced gradients lie in one buffer.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import models  # noqa: E402
from training.run import cli  # noqa: E402
import utils  # noqa: E402

PORT, NAMES = sys.argv[1], sys.argv[2:] or list(models.MODELS)
# The parameters that no gradient reaches, by design: EfficientNet's expansion layer in its
# blocks of expand_ratio 1, which forward never uses (kept for pytorch-cifar's checkpoints). Any
# other parameter that no step's averaged gradient reaches is a dead layer, and fails the model.
STILL = {"efficientnetb0": ["layers.0.bn1.bias", "layers.0.bn1.weight", "layers.0.conv1.weight"]}
# DDP finds a parameter without a gradient at its second step; Horovod's hooks meet every
# parameter at the first.
STEPS = 2 if PORT == "ddp" else 1


def setup():
    """(rank, wrap(args, model, optimizer) -> (model to call, optimizer), allgather)."""
    if PORT == "ddp":
        import torch.distributed as dist

        from training.ports import process_group
        process_group.join_job(torch.device("cpu"))

        def gather(t):
            out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
            dist.all_gather(out, t)
            return torch.stack(out)
        return dist.get_rank(), lambda args, m, opt: (process_group.distributed_model(m), opt), gather
    import horovod.torch as hvd

    from training.ports import hvd_port
    hvd.init()
    world = utils.World(grad_path="one" if PORT == "horovod-one" else "hooks")

    def wrap(args, model, optimizer):
        optimizer = hvd_port.distributed_optimizer(args, model, optimizer, world.grad_path)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # a fresh optimizer: no state to send
        return model, optimizer
    return hvd.rank(), wrap, lambda t: hvd.allgather(t.unsqueeze(0), name="checksums")


def main():
    rank, wrap, gather = setup()
    torch.set_num_threads(1)
    parser = cli.add_ddp_args(cli.build_parser("")) if PORT == "ddp" else cli.add_horovod_args(cli.build_parser(""))
    for name in NAMES:
        args = cli.parse_args(parser, ["--arch", name, "--batch-size", "2"])
        model = utils.build_model(args, torch.device("cpu"))
        before = [p.detach().clone() for p in model.parameters()]
        call, optimizer = wrap(args, model, utils.make_optimizer(model, args))
        scaler = utils.make_scaler(args, torch.device("cpu"))
        for group in optimizer.param_groups:
            group["lr"] = 0.01
        g = torch.Generator().manual_seed(rank)
        reached = set()  # the parameters that a step's averaged gradient reached
        for _ in range(STEPS):
            x, y = torch.randn(2, 3, 32, 32, generator=g), torch.randint(0, 10, (2,), generator=g)
            optimizer.zero_grad()
            F.cross_entropy(call(x), y).backward()
            utils.optimizer_step(optimizer, scaler)
            reached |= {n for n, p in model.named_parameters() if p.grad is not None and p.grad.any()}
        dead = sorted(n for n, _ in model.named_parameters() if n not in reached)
        buffers = {p.grad.untyped_storage().data_ptr() for p in model.parameters() if p.grad is not None}
        params = list(model.parameters())
        sums = torch.stack([p.detach().double().sum() for p in params])
        every = gather(sums)
        why = None
        if not torch.isfinite(sums).all():
            why = "non-finite weights"
        elif not all(torch.equal(every[0], other) for other in every[1:]):
            why = "ranks differ"
        elif dead != STILL.get(name, []):
            why = f"no gradient reached {dead} (expected none but {STILL.get(name, [])})"
        elif not any(not torch.equal(b, p) for b, p in zip(before, params) if p.requires_grad):
            why = "no weight moved"
        elif PORT == "horovod-one" and len(buffers) != 1:
            why = f"its gradients lie in {len(buffers)} buffers, not in one allreduce's"
        if rank == 0:
            print(f"{name} ok" if why is None else f"{name} FAILED: {why}", flush=True)


if __name__ == "__main__":
    main()
    if PORT == "ddp":  # as main_ddp.py leaves its job (process_group.py says why)
        from training.ports import process_group
        process_group.leave_job()
