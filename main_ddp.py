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

# DDP: torch.distributed and DistributedDataParallel (main.py runs without them), its group.
import torch
import torch.distributed as dist

from training.ports import process_group
from training.run import checkpoints, cli, data, devices, launch, rundir, runlog
import utils


def main(argv=None):
    # DDP: the port's flags.
    args = cli.parse_args(cli.add_ddp_args(cli.build_parser(__doc__)), argv)
    # DDP: a GPU, or a share of the cores, by torchrun's local rank, before joining the job.
    device = devices.take_device(*launch.torchrun_local())
    process_group.join_job(device)
    # DDP: metrics summed over the ranks; the LR x their number.
    world = utils.World.of(args, rank=dist.get_rank(), size=dist.get_world_size(), no_sync=True,
                           allreduce=process_group.summed_copy(dist.all_reduce))
    launch.stop_on(args.stop_signal)  # a scheduler's warning signal, as SIGTERM
    reports = world.is_rank0

    rundir.preflight(args, reports)
    data.prepare(args)
    train_set, test_set = data.load(args)
    train_loader, test_loader = utils.make_loaders(args, train_set, test_set, device, world)

    model = utils.build_model(args, device)
    # DDP: BatchNorm statistics over the global batch.
    if args.sync_bn:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    optimizer = utils.make_optimizer(model, args)
    # DDP: every rank reads the checkpoint.
    start = checkpoints.restore(args, model, optimizer, reports)
    scaler = utils.make_scaler(args, device, start.scaler)
    schedule = utils.make_schedule(args, start.schedule, world.lr_scale)
    # DDP: gradients averaged during backward; the wrapper, not the model, compiled (--compile).
    train_model = utils.training_model(args, model, optimizer, world,
                                       wrap=process_group.distributed_model)

    if args.evaluate:
        test = utils.evaluate(train_model, test_loader, args, world)
        runlog.report_evaluation(test, reports)
        return model, test

    rundir.hold(args, reports)  # from here on, this run writes into its folder
    log = runlog.RunLog(args, reports, world.size, start.history, start.epoch,
                        start.tracking)
    best_acc = start.best_acc
    for epoch in range(start.epoch, cli.last_epoch(args)):
        if utils.target_reached(args, log.history):  # --target-acc: an epoch reached it
            break
        train, test, seconds = utils.train_and_test(train_model, model, train_loader, test_loader,
                                                    optimizer, scaler, schedule, epoch, args, world,
                                                    profile=epoch == start.epoch)
        is_best, best_acc = test["acc"] > best_acc, max(best_acc, test["acc"])
        history = log.add(epoch, train, test, seconds)  # the epoch's line and metrics row
        ckpt = checkpoints.checkpoint_state(args, model, optimizer, scaler, schedule, epoch + 1,
                                            best_acc, world.size, history, log.tracking)
        with launch.stops_held():  # a stop signal waits for both
            checkpoints.save(args, ckpt, is_best, reports)
            log.write()  # metrics.csv after the checkpoint that holds its rows
    log.close()
    return model, log.history


if __name__ == "__main__":
    # DDP: leave the job whole, however main ended.
    sys.exit(launch.run_cli(main, finish=process_group.leave_job))
