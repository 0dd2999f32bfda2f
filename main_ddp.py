"""Train a CIFAR-10 model: main.py on one device (CUDA when available, else the CPU),
main_horovod.py on many processes with Horovod, main_ddp.py with PyTorch's DDP.
`diff main.py main_horovod.py` (or main_ddp.py) shows the port.

  python main.py --arch resnet18                      # ckpt.pth, metrics.csv in ./checkpoint
  python main.py --resume --lr 0.01                   # continue with a new cosine from 0.01
  python main.py --evaluate                           # test the checkpoint and exit
  horovodrun -np 4 python main_horovod.py --arch resnet18
  mpirun -np 4 --hostfile hostfile python main_horovod.py --arch resnet18
  torchrun --nproc_per_node 4 main_ddp.py --arch resnet18
  python main.py --dataset synthetic --arch lenet --epochs 2   # no download needed
"""
import os  # DDP: torchrun says where a process stands in its environment
import sys
import time

import torch  # DDP: torch.distributed and DistributedDataParallel; main.py runs without them
import torch.distributed as dist

import checkpoints
import cli
import data
import devices
import runlog
import utils


def main(argv=None):
    args = cli.parse_args(cli.add_ddp_args(cli.build_parser(__doc__)), argv)  # DDP: its flags
    device = devices.pick_device(*cli.torchrun_local())  # one GPU, or a share of the cores, first
    alone = {} if "RANK" in os.environ else dict(store=dist.HashStore(), rank=0, world_size=1)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", **alone)  # join the job
    rank, size = dist.get_rank(), dist.get_world_size()  # (a lone `python main_ddp.py` is one)
    allreduce = utils.summed_copy(dist.all_reduce)  # metric sums, once per interval
    verbose = rank == 0
    progress = runlog.Progress(verbose)

    checkpoints.preflight(args, verbose)
    data.prepare(args)
    train_set, test_set = data.load(args)
    train_loader, test_loader = utils.make_loaders(args, train_set, test_set, device, rank, size)

    model = utils.build_model(args, device)
    if args.sync_bn:  # DDP: BatchNorm statistics over the global batch
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    lr_scale = args.batches_per_allreduce * size  # DDP: LR x size (and x k), as Horovod's
    optimizer = utils.make_optimizer(model)
    start = checkpoints.restore(args, model, optimizer, verbose)  # DDP: every rank reads it
    scaler = utils.make_scaler(args, device, start["scaler"])
    schedule = utils.LRSchedule(**start["schedule"], epochs=args.epochs, scale=lr_scale,
                                warmup_epochs=args.warmup_epochs)  # DDP: ramp up to it
    train_model = utils.training_model(args, model, optimizer)
    # DDP: gradients averaged during backward; BatchNorm running statistics synced at the start,
    # then each rank's own (forward_sync_buffers=False), as under Horovod
    ddp_model = torch.nn.parallel.DistributedDataParallel(
        train_model, forward_sync_buffers=False, gradient_as_bucket_view=True)

    if args.evaluate:
        test = utils.evaluate(train_model, test_loader, args, progress, allreduce)
        progress.write(runlog.evaluation_line(test))
        return model, test

    log = runlog.RunLog(args, verbose, size, start["history"], purge_step=start["epoch"] + 1)
    best_acc = start["best_acc"]
    for epoch in range(start["epoch"], cli.last_epoch(args)):
        train_loader.set_epoch(epoch)
        utils.seed_epoch(args.seed, epoch, rank)
        t0 = time.perf_counter()
        # DDP: the wrapped model averages gradients; no_sync skips that for k - 1 of k passes
        train = utils.train_epoch(ddp_model, train_loader, optimizer, scaler, schedule, epoch,
                                  args, progress, allreduce, start["epoch"], ddp_model.no_sync)
        seconds = time.perf_counter() - t0
        test = utils.evaluate(train_model, test_loader, args, progress, allreduce)
        is_best, best_acc = test["acc"] > best_acc, max(best_acc, test["acc"])
        state = checkpoints.checkpoint_state(args, model, optimizer, scaler, schedule, epoch + 1,
                                             best_acc, size)
        log.epoch_end(epoch, train, test, seconds, state, is_best)
    log.close()
    return model, log.history


if __name__ == "__main__":
    sys.exit(cli.run_cli(main, finish=dist.destroy_process_group))  # DDP: leave the job
