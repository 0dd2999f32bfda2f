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

import checkpoints
import cli
import data
import devices
import divergence
import horovod.torch as hvd  # Horovod: the PyTorch binding; main.py runs without it
import launch
import layout  # Horovod: its collectives take contiguous tensors only
import runlog
import sweep  # Horovod: --sweep, one MPI job as many runs
import utils


def main(argv=None, comm=None):
    args = cli.parse_args(cli.add_horovod_args(cli.build_parser(__doc__)), argv)  # Horovod: flags
    if args.sweep and comm is None:  # Horovod: each group of ranks calls main with its comm
        return sweep.run(main, args, argv)
    launch.stop_on(args.stop_signal)  # a scheduler's warning signal, as SIGTERM
    hvd.init(comm)  # Horovod: join the job (a sweep run: its group); rank, size are plain values
    slot = sweep.node_slot() if comm else (hvd.local_rank(), hvd.local_size())  # place on the host:
    device = devices.pick_device(*slot)  # one GPU per process, or a share of the cores
    devices.share_cores(device, *slot, spare=devices.other_threads())
    cli.check_adasum(args, hvd.size(), hvd.mpi_enabled())  # Horovod: Adasum's own limits
    local = hvd.local_size() if device.type == "cuda" and hvd.nccl_built() else 1  # NCCL's mean
    port = utils.Port(  # Horovod: metrics summed over the ranks, the LR x their number
        rank=hvd.rank(), size=hvd.size(), allreduce=lambda t: hvd.allreduce(t, op=hvd.Sum),
        lr_scale=args.batches_per_allreduce * (local if args.use_adasum else hvd.size()),
        batches_per_allreduce=args.batches_per_allreduce, adasum=args.use_adasum)
    reports = port.reports

    checkpoints.preflight(args, reports)
    if hvd.local_rank() == 0:  # Horovod: one process per host prepares the data
        data.prepare(args)
    hvd.barrier()  # while the others wait, so no two write the same files
    train_set, test_set = data.load(args)
    train_loader, test_loader = utils.make_loaders(args, train_set, test_set, device, port)

    model = utils.build_model(args, device)
    if args.sync_bn:  # Horovod: BatchNorm statistics over the global batch
        model = utils.replace_batchnorm(model, hvd.SyncBatchNorm)
    optimizer = distributed_optimizer(args, model, utils.make_optimizer(model))  # allreduce grads
    start = checkpoints.restore(args, model, optimizer) if reports else None  # rank 0 reads
    start = hvd.broadcast_object(start, root_rank=0, name="start")  # and sends where to start,
    if start["optimizer_state"]:  # the optimizer state if any (fresh, Horovod takes a hidden step),
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # then the weights
    scaler = utils.make_scaler(args, device, start["scaler"])
    schedule = utils.LRSchedule(**start["schedule"], epochs=args.epochs, scale=port.lr_scale,
                                warmup_epochs=args.warmup_epochs)  # Horovod: ramp up to it
    train_model = utils.training_model(args, model, optimizer)

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
        train = utils.train_epoch(train_model, train_loader, optimizer, scaler, schedule, epoch,
                                  args, port, profile=epoch == start["epoch"])
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


def distributed_optimizer(args, model, optimizer):  # Horovod: allreduce gradients in backward
    wrapped = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), groups=args.allreduce_groups,
        compression=layout.GradLayout(  # channels_last gradients go as contiguous views
            hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none),
        backward_passes_per_step=args.batches_per_allreduce,  # k backward passes per allreduce
        op=hvd.Adasum if args.use_adasum else hvd.Average)
    # The wrapper re-runs SGD.__init__ without fused=True, which loses the fused step's flag
    # that lets GradScaler skip an inf step on the device; without it, each step reads found_inf.
    wrapped._step_supports_amp_scaling = getattr(optimizer, "_step_supports_amp_scaling", False)
    return wrapped


if __name__ == "__main__":
    sys.exit(launch.run_cli(main))
