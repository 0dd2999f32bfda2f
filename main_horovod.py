"""Train a CIFAR-10 model: main.py on one device (CUDA when available, else the CPU),
main_horovod.py on many processes with Horovod. `diff main.py main_horovod.py` shows the port.

  python main.py --arch resnet18                      # ckpt.pth, metrics.csv in ./checkpoint
  python main.py --resume --lr 0.01                   # continue with a new cosine from 0.01
  python main.py --evaluate                           # test the checkpoint and exit
  horovodrun -np 4 python main_horovod.py --arch resnet18
  mpirun -np 4 --hostfile hostfile python main_horovod.py --arch resnet18
  python main.py --dataset synthetic --arch lenet --epochs 2   # no download needed
"""
import functools  # Horovod: for the allreduce below
import sys
import time

import data
import horovod.torch as hvd  # Horovod: the PyTorch binding
import utils


def main(argv=None):
    parser = utils.add_horovod_args(utils.build_parser(__doc__))  # Horovod: --warmup-epochs, --sync-bn, ...
    args = utils.parse_args(parser, argv)
    hvd.init()  # Horovod: join the other processes
    rank, size = hvd.rank(), hvd.size()  # Horovod: this process's place in the world
    device = utils.pick_device(hvd.local_rank(), hvd.local_size())  # Horovod: one GPU per process; on CPU, share the cores
    allreduce = functools.partial(hvd.allreduce, op=hvd.Sum)  # Horovod: metric sums over all ranks, once per interval
    verbose = rank == 0
    progress = utils.Progress(verbose)

    utils.preflight(args, verbose)
    if hvd.local_rank() == 0: data.prepare(args)  # Horovod: one process per host fetches or generates data,
    hvd.barrier()  # Horovod: while the others wait, so no two write the same files
    train_set, test_set = data.load(args)
    train_loader, test_loader = utils.make_loaders(args, train_set, test_set, device, rank, size)

    model = utils.build_model(args, device)
    if args.sync_bn:  # Horovod: BatchNorm statistics over the global batch
        model = utils.replace_batchnorm(model, hvd.SyncBatchNorm)  # Horovod:
    utils.check_adasum(args, size, hvd.mpi_enabled())  # Horovod: Adasum runs on MPI, at power-of-two sizes
    lr_scale = args.batches_per_allreduce * (1 if args.use_adasum else size)  # Horovod: linear scaling; Adasum needs none,
    if args.use_adasum and device.type == "cuda" and hvd.nccl_built():  # Horovod: except across NCCL's local average
        lr_scale = args.batches_per_allreduce * hvd.local_size()  # Horovod:
    optimizer = utils.make_optimizer(model)
    optimizer = hvd.DistributedOptimizer(  # Horovod: allreduce gradients during backward
        optimizer, named_parameters=model.named_parameters(),  # Horovod:
        compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none,  # Horovod:
        backward_passes_per_step=args.batches_per_allreduce,  # Horovod: accumulate locally, then one allreduce
        op=hvd.Adasum if args.use_adasum else hvd.Average)  # Horovod:
    start = utils.restore(args, model, optimizer) if rank == 0 else None  # Horovod: rank 0 alone reads the checkpoint
    start = hvd.broadcast_object(start, root_rank=0, name="start")  # Horovod: epoch, best acc, schedule, scaler
    if start["optimizer_state"]:  # Horovod: on a fresh run this would take a hidden step (weight decay)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)  # Horovod:
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # Horovod: after it: every rank starts identical
    scaler = utils.make_scaler(args, device, start["scaler"])
    schedule = utils.LRSchedule(**start["schedule"], epochs=args.epochs, scale=lr_scale, warmup_epochs=args.warmup_epochs)  # Horovod: ramp up
    train_model = utils.compile_model(args, model)

    if args.evaluate:
        test = utils.evaluate(train_model, test_loader, args, progress, allreduce)
        progress.write(utils.evaluation_line(test))
        return model, test

    log = utils.RunLog(args, verbose, size, start["history"], purge_step=start["epoch"] + 1)
    best_acc = start["best_acc"]
    for epoch in range(start["epoch"], utils.last_epoch(args)):
        train_loader.set_epoch(epoch)
        utils.seed_epoch(args.seed, epoch, rank)
        t0 = time.perf_counter()
        train = utils.train_epoch(train_model, train_loader, optimizer, scaler, schedule, epoch, args,
                                  progress, allreduce, profile_epoch=start["epoch"])
        seconds = time.perf_counter() - t0
        test = utils.evaluate(train_model, test_loader, args, progress, allreduce)
        is_best, best_acc = test["acc"] > best_acc, max(best_acc, test["acc"])
        state = utils.checkpoint_state(args, model, optimizer, scaler, schedule, epoch + 1, best_acc, size)
        log.epoch_end(epoch, train, test, seconds, state, is_best)
    log.close()
    return model, log.history


if __name__ == "__main__":
    sys.exit(utils.run_cli(main))
