"""Train a CIFAR-10 model with Horovod elastic: workers may leave or join mid-run.

main_horovod.py with the world size free to change. The model, optimizer, epoch,
best accuracy and metrics history live in an hvd.elastic.TorchState that is
committed at the end of every epoch; when a worker fails or the host discovery
script reports other slots, the survivors roll back to the last commit (a failure)
or carry on from it (a planned change), re-shard the data and re-scale the LR for
the new world size, and go on. An epoch that had finished stays finished.

  echo 3 > slots
  HOROVOD_SLOTS_FILE=slots horovodrun -np 3 --min-np 2 --max-np 3 \\
      --host-discovery-script scripts/discover_hosts.sh python main_elastic.py --arch resnet18
  echo 2 > slots      # one slot goes away; training continues at np=2

Flags, checkpoints and metrics.csv are main_horovod.py's. Whoever is rank 0 of the
current world writes them, so --checkpoint-dir must be a folder every worker sees.
"""
import contextlib
import functools
import sys
import time

import checkpoints
import cli
import data
import devices
import horovod.torch as hvd
import layout
import runlog
import utils
from errors import TrainerError, UsageError


class ElasticState(hvd.elastic.TorchState):
    """TorchState that broadcasts a channels_last model as contiguous tensors, and says
    when the driver reports a change of hosts. Only the current rank 0 hears from the
    driver; the change takes effect at the next commit."""

    def sync(self):
        with layout.contiguous(self.model, self.optimizer):  # Horovod's broadcasts need it
            super().sync()

    def on_hosts_updated(self, timestamp, update_res):
        super().on_hosts_updated(timestamp, update_res)
        what = {1: "removed", 2: "added"}.get(int(update_res), "changed")
        print(f"elastic: hosts {what}; the world is resized at the end of this epoch", flush=True)


class World:
    """What depends on this process's rank and the world's size: made at the start and
    again after every reset (the reset callback runs before the state sync, so it uses
    no synced value)."""

    def __init__(self, args, train_set, test_set, device):
        self.args, self.sets, self.device = args, (train_set, test_set), device
        self.loaders = None
        self.log = None  # the RunLog of the current world
        self.size = None  # the size of the last world that trained
        self.profile_epoch = None  # the first epoch this process trains, profiled once

    def reset(self):
        if self.device.type == "cpu":
            devices.pick_device(hvd.local_rank(), hvd.local_size())  # share the cores anew
        self.loaders = None  # free the old loaders' copies before building the new ones
        self.loaders = utils.make_loaders(self.args, *self.sets, self.device,
                                          hvd.rank(), hvd.size())
        self.close_log()  # rank 0 may be another process now

    def close_log(self):
        if self.log is not None and self.log.writer is not None:
            with contextlib.suppress(Exception):
                self.log.writer.close()
        self.log = None


def lr_scale(args):
    """main_horovod.py's linear scaling, of the current world: re-read after every reset.
    (Its Adasum case cannot arise: Adasum needs the MPI controller, elastic runs use gloo.)"""
    return args.batches_per_allreduce * hvd.size()


def main(argv=None):
    args = cli.parse_args(cli.add_horovod_args(cli.build_parser(__doc__)), argv)
    if args.evaluate:
        raise UsageError("main_elastic.py only trains; evaluate with main.py --evaluate")
    if args.use_adasum:
        raise UsageError("--use-adasum needs Horovod's MPI controller, and elastic runs use gloo; "
                         "use main_horovod.py for Adasum")
    hvd.init()
    device = devices.pick_device(hvd.local_rank(), hvd.local_size())
    allreduce = functools.partial(hvd.allreduce, op=hvd.Sum)  # metric sums, once per interval

    # Workers start and restart at any time, so no barrier (a collective) here: every
    # worker calls prepare, whose lock lets one do the work while the others wait.
    data.prepare(args)
    train_set, test_set = data.load(args)

    model = utils.build_model(args, device)
    if args.sync_bn:
        model = utils.replace_batchnorm(model, hvd.SyncBatchNorm)
    optimizer = utils.make_optimizer(model)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=layout.GradLayout(  # channels_last gradients go as contiguous views
            hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none),
        backward_passes_per_step=args.batches_per_allreduce, op=hvd.Average)

    # No collective op may run before the elastic function: a worker that joins later
    # runs this same code while the others wait in the state sync. So rank 0 checks and
    # reads the checkpoint on its own, and the first sync hands the result (or the error)
    # to everyone. A worker that joins later gets a rank after the running ones' (the
    # driver keeps their order), so it does not run the check that ckpt.pth does not
    # exist yet, which it would fail: it takes rank 0's state instead.
    start, error = None, None
    if hvd.rank() == 0:
        try:
            checkpoints.preflight(args, True)
            start = checkpoints.restore(args, model, optimizer)
        except TrainerError as e:
            error = e
    start = start or checkpoints.fresh_start(args)
    scaler = utils.make_scaler(args, device, start["scaler"])
    schedule = utils.LRSchedule(**start["schedule"], epochs=args.epochs,
                                warmup_epochs=args.warmup_epochs)
    state = ElasticState(
        model=model, optimizer=optimizer,
        epoch=start["epoch"],  # the next epoch; with the seed, it fixes data order and augmentation
        best_acc=start["best_acc"], history=start["history"], schedule=schedule.state_dict(),
        scaler=scaler.state_dict(), optimizer_state=start["optimizer_state"], error=error)

    world = World(args, train_set, test_set, device)
    world.reset()
    state.register_reset_callbacks([world.reset])
    train_model = utils.training_model(args, model, optimizer)

    @hvd.elastic.run
    def run_epochs(state):
        # Here every worker holds rank 0's last committed state.
        if state.error is not None:
            if hvd.rank() == 0 or isinstance(state.error, UsageError):
                raise state.error  # a usage error is printed by rank 0 alone
            raise TrainerError("stopping because rank 0 could not start the run "
                               "(its error is above)")
        if not state.optimizer_state:
            # The sync of a fresh optimizer takes a step of zero gradients to create its
            # state, which leaves weight decay in SGD's momentum; main_horovod.py has none.
            optimizer.state.clear()
        if scaler.is_enabled() and state.scaler:
            scaler.load_state_dict(state.scaler)
        rank, size = hvd.rank(), hvd.size()
        schedule.load_state_dict(state.schedule)
        schedule.scale = lr_scale(args)  # linear scaling by this world's size
        if world.profile_epoch is None:
            world.profile_epoch = state.epoch
        if rank == 0 and world.size not in (None, size):
            print(f"elastic: world size {world.size} -> {size}; "
                  f"continuing at epoch {state.epoch + 1}", flush=True)
        world.size = size
        train_loader, test_loader = world.loaders
        progress = runlog.Progress(rank == 0)
        log = runlog.RunLog(args, rank == 0, size, state.history, purge_step=state.epoch + 1)
        world.log = log
        for epoch in range(state.epoch, cli.last_epoch(args)):
            train_loader.set_epoch(epoch)
            utils.seed_epoch(args.seed, epoch, rank)
            t0 = time.perf_counter()
            train = utils.train_epoch(train_model, train_loader, optimizer, scaler, schedule, epoch,
                                      args, progress, allreduce, profile_epoch=world.profile_epoch)
            seconds = time.perf_counter() - t0
            test = utils.evaluate(train_model, test_loader, args, progress, allreduce)
            is_best, best_acc = test["acc"] > state.best_acc, max(state.best_acc, test["acc"])
            ckpt = checkpoints.checkpoint_state(args, model, optimizer, scaler, schedule, epoch + 1,
                                                best_acc, size)
            log.epoch_end(epoch, train, test, seconds, ckpt, is_best)  # rank 0 writes
            # New objects, not in-place changes: commit() keeps references.
            state.epoch, state.best_acc, state.history = epoch + 1, best_acc, list(log.history)
            state.scaler, state.optimizer_state = scaler.state_dict(), True
            # Saves the state, then raises HostsUpdatedInterrupt if the hosts changed:
            # the epoch is kept, and the run goes on from the next one in the new world.
            state.commit()
        log.close()
        world.log = None
        return log.history

    try:
        return model, run_epochs(state)
    finally:
        world.close_log()


if __name__ == "__main__":
    sys.exit(cli.run_cli(main))
