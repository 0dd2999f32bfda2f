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
import sys
import time

import checkpoints
import cli
import data
import devices
import runlog
import utils


def main(argv=None):
    args = cli.parse_args(cli.build_parser(__doc__), argv)
    rank, size = 0, 1
    device = devices.pick_device()
    allreduce = utils.local_sum
    verbose = rank == 0
    progress = runlog.Progress(verbose)

    checkpoints.preflight(args, verbose)
    data.prepare(args)
    train_set, test_set = data.load(args)
    train_loader, test_loader = utils.make_loaders(args, train_set, test_set, device, rank, size)

    model = utils.build_model(args, device)
    lr_scale = 1
    optimizer = utils.make_optimizer(model)
    start = checkpoints.restore(args, model, optimizer)
    scaler = utils.make_scaler(args, device, start["scaler"])
    schedule = utils.LRSchedule(**start["schedule"], epochs=args.epochs, scale=lr_scale,
                                warmup_epochs=0)
    train_model = utils.training_model(args, model, optimizer)

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
        train = utils.train_epoch(train_model, train_loader, optimizer, scaler, schedule, epoch,
                                  args, progress, allreduce, profile_epoch=start["epoch"])
        seconds = time.perf_counter() - t0
        test = utils.evaluate(train_model, test_loader, args, progress, allreduce)
        is_best, best_acc = test["acc"] > best_acc, max(best_acc, test["acc"])
        state = checkpoints.checkpoint_state(args, model, optimizer, scaler, schedule, epoch + 1,
                                             best_acc, size)
        log.epoch_end(epoch, train, test, seconds, state, is_best)
    log.close()
    return model, log.history


if __name__ == "__main__":
    sys.exit(cli.run_cli(main))
