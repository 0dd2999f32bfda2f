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

# Horovod: the PyTorch binding (main.py runs without it); what the port asks of Horovod.
import horovod.torch as hvd

from training.ports import hvd_port
from training.run import checkpoints, cli, data, devices, launch, rundir, runlog
import utils


def main(argv=None):
    # Horovod: the port's flags.
    args = cli.parse_args(cli.add_horovod_args(cli.build_parser(__doc__)), argv)
    # Horovod: its settings for this device (CUDA's; the CPU's waits), then join the job.
    hvd_port.apply()
    hvd.init()
    # Horovod: GPU hvd.local_rank(), or this process's share of the cores.
    device = devices.take_device(hvd.local_rank(), hvd.local_size(), spare=devices.other_threads())
    # Horovod: metrics summed over the ranks; the LR x their number (Adasum: its own scale).
    world = utils.World.of(args, rank=hvd.rank(), size=hvd.size(), lr_size=hvd_port.lr_size(args),
                           allreduce=lambda t: hvd.allreduce(t, op=hvd.Sum),
                           grad_path=hvd_port.grad_path(args))
    launch.stop_on(args.stop_signal)  # a scheduler's warning signal, as SIGTERM
    reports = world.is_rank0

    rundir.preflight(args, reports)
    data.prepare(args)
    train_set, test_set = data.load(args)
    train_loader, test_loader = utils.make_loaders(args, train_set, test_set, device, world)

    model = utils.build_model(args, device)
    # Horovod: BatchNorm statistics over the global batch (--sync-bn).
    model = hvd_port.replace_batchnorm(model, hvd.SyncBatchNorm) if args.sync_bn else model
    # Horovod: gradients averaged over the ranks (hvd.DistributedOptimizer, by grad_path).
    optimizer = hvd_port.distributed_optimizer(args, model, utils.make_optimizer(model, args),
                                               world.grad_path)
    # Horovod: rank 0 reads the checkpoint; every rank gets where to start from it.
    start = checkpoints.restore(args, model, optimizer) if reports else None
    start = hvd.broadcast_object(start, name="start")
    # Horovod: rank 0's optimizer state, if it has one, and its weights to every rank.
    if start.optimizer_state:
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    scaler = utils.make_scaler(args, device, start.scaler)
    schedule = utils.make_schedule(args, start.schedule, world.lr_scale)
    train_model = utils.training_model(args, model, optimizer, world)

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
    sys.exit(launch.run_cli(main))
