"""Train a CIFAR-10 model: main.py on one device (CUDA when available, else the CPU),
main_horovod.py on many processes with Horovod, main_ddp.py with PyTorch's DDP.
`diff main.py main_horovod.py` (or main_ddp.py) shows the port.

  python main.py --arch resnet18                      # ckpt.pth, metrics.csv in ./checkpoint
  python main.py --resume --lr 0.01                   # continue with a new cosine from 0.01
  python main.py --evaluate                           # test the checkpoint and exit
  horovodrun -np 2 python main_horovod.py --arch resnet18
  mpirun -np 2 --hostfile hostfile python main_horovod.py --arch resnet18
  torchrun --nproc_per_node 2 main_ddp.py --arch resnet18
  python main.py --dataset synthetic --arch lenet --epochs 2   # no download needed
"""
import sys
import time

import torch  # DDP: torch.distributed and DistributedDataParallel; main.py runs without them
import torch.distributed as dist

import checkpoints
import cli
import data
import devices
import divergence
import launch
import process_group  # DDP: the job's process group, joined and left
import runlog
import utils


def main(argv=None):
    args = cli.parse_args(cli.add_ddp_args(cli.build_parser(__doc__)), argv)  # DDP: its flags
    launch.stop_on(args.stop_signal)  # a scheduler's warning signal, as SIGTERM
    device = devices.pick_device(*launch.torchrun_local())  # DDP: one GPU, or a share of the cores,
    devices.share_cores(device, *launch.torchrun_local())  # before torch.distributed starts
    process_group.join_job(device)  # join torchrun's job (a lone `python main_ddp.py`: one)
    size = dist.get_world_size()  # metric sums and the LR over the world size
    port = utils.Port(rank=dist.get_rank(), size=size, allreduce=utils.summed_copy(dist.all_reduce),
                      lr_scale=args.batches_per_allreduce * size,
                      batches_per_allreduce=args.batches_per_allreduce, no_sync=True)
    reports = port.reports

    checkpoints.preflight(args, reports)
    data.prepare(args)
    train_set, test_set = data.load(args)
    train_loader, test_loader = utils.make_loaders(args, train_set, test_set, device, port)

    model = utils.build_model(args, device)
    if args.sync_bn:  # DDP: BatchNorm statistics over the global batch
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    optimizer = utils.make_optimizer(model)
    start = checkpoints.restore(args, model, optimizer, reports)  # DDP: every rank reads it
    scaler = utils.make_scaler(args, device, start["scaler"])
    schedule = utils.LRSchedule(**start["schedule"], epochs=args.epochs, scale=port.lr_scale,
                                warmup_epochs=args.warmup_epochs)  # DDP: ramp up to it
    train_model = utils.training_model(args, model, optimizer)
    ddp_model = distributed_model(train_model)  # DDP: gradients averaged during backward

    if args.evaluate:
        test = utils.evaluate(train_model, test_loader, args, port)
        runlog.report_evaluation(test, reports)
        return model, test

    log = runlog.RunLog(args, reports, port.size, start["history"], start["epoch"])
    best_acc = start["best_acc"]
    for epoch in range(start["epoch"], cli.last_epoch(args)):
        if log.target_reached():  # --target-acc: the last epoch reached it
            break
        t0 = time.perf_counter()
        train = utils.train_epoch(ddp_model, train_loader, optimizer, scaler, schedule, epoch,
                                  args, port, profile=epoch == start["epoch"])  # DDP: wrapped
        seconds = time.perf_counter() - t0
        test = utils.evaluate(train_model, test_loader, args, port)
        divergence.check_epoch(model, train, test, epoch, port)  # before anything is saved
        is_best, best_acc = test["acc"] > best_acc, max(best_acc, test["acc"])
        history = log.add(epoch, train, test, seconds)  # the epoch's line and metrics row
        state = checkpoints.checkpoint_state(args, model, optimizer, scaler, schedule, epoch + 1,
                                             best_acc, port.size, history)
        with launch.stops_held():  # a stop signal waits for both
            checkpoints.save(args, state, is_best, reports)
            log.write()  # metrics.csv after the checkpoint that holds its rows
    log.close()
    return model, log.history


def distributed_model(model):  # DDP: the wrapper, one function that tests share
    """DDP: gradients averaged during backward; BatchNorm running statistics synced at the start,
    then each rank's own through an epoch (forward_sync_buffers=False), as under Horovod, until
    utils.evaluate averages them. Every parameter that requires a gradient gets one in every
    step, so DDP need not search for unused ones (find_unused_parameters costs a graph walk)."""
    return torch.nn.parallel.DistributedDataParallel(
        model, forward_sync_buffers=False, gradient_as_bucket_view=True)


if __name__ == "__main__":
    sys.exit(launch.run_cli(main, finish=process_group.leave_job))  # DDP: leave the job whole
