"""Train a CIFAR-10 model with Horovod elastic: workers may leave or join mid-run.

main_horovod.py with the world size free to change. The model, optimizer, epoch,
best accuracy and metrics history live in an hvd.elastic.TorchState that is
committed at the end of every epoch; when a worker fails or the host discovery
script reports other slots, the survivors roll back to the last commit (a failure)
or carry on from it (a planned change), re-shard the data and re-scale the LR for
the new world size, and go on. An epoch that had finished stays finished.

  echo 3 > slots
  horovodrun -np 3 --min-np 2 --max-np 3 --network-interface lo \\
      --host-discovery-script "scripts/discover_hosts.sh slots" \\
      python main_elastic.py --arch resnet18
  echo 2 > slots      # one slot goes away; training continues at np=2

On one host, --network-interface lo is needed: without it the driver looks for a
second host's interface and waits. Flags, checkpoints and metrics.csv are
main_horovod.py's. Whoever is rank 0 of the current world writes them, so
--checkpoint-dir must be a folder every worker sees.
"""
import sys

import horovod.torch as hvd

from training.base import layout
from training.base.errors import TrainerError, UsageError
from training.ports import hvd_port
from training.run import checkpoints, cli, data, devices, launch, rundir, runlog
import utils


def main(argv=None):
    args = cli.parse_args(cli.add_elastic_args(cli.build_parser(__doc__)), argv)
    launch.stop_on(args.stop_signal)  # a scheduler's warning signal, as SIGTERM
    hvd_port.apply()  # before init, which reads them: Horovod's settings for this device
    hvd.init()
    device = devices.pick_device(hvd.local_rank(), hvd.local_size())
    worker = Worker(args, device)  # right after init: Horovod's are the only other threads yet

    # Workers start and restart at any time, so no barrier (a collective) here: every
    # worker calls prepare, whose lock lets one do the work while the others wait.
    data.prepare(args)
    worker.sets = data.load(args)

    model = utils.build_model(args, device)
    if args.sync_bn:
        model = hvd_port.replace_batchnorm(model, hvd.SyncBatchNorm)
    optimizer = hvd_port.distributed_optimizer(args, model, utils.make_optimizer(model, args))
    start, error = first_start(args, model, optimizer)
    scaler = utils.make_scaler(args, device, start.scaler)
    schedule = utils.make_schedule(args, start.schedule)  # scaled in each world
    state = ElasticState(
        model=model, optimizer=optimizer,
        epoch=start.epoch,  # the next epoch; with the seed, it fixes data order and augmentation
        best_acc=start.best_acc, history=start.history, schedule=schedule.state_dict(),
        scaler=scaler.state_dict(), optimizer_state=start.optimizer_state, error=error,
        tracking=start.tracking)
    worker.reset()
    state.register_reset_callbacks([worker.reset])
    train_model = utils.training_model(args, model, optimizer)

    try:
        return model, run_epochs(state, worker, train_model, optimizer, scaler, schedule)
    finally:
        worker.close_log()


def first_start(args, model, optimizer):
    """(where to start, the error that stops the run, or None), on rank 0; elsewhere a fresh
    start that the first state sync replaces.

    No collective may run before the elastic function: a worker that joins later runs
    this same code while the others wait in the state sync. So rank 0 checks and reads
    the checkpoint on its own, and the first sync hands the result (or the error) to
    everyone. A worker that joins later gets a rank after the running ones' (the driver
    keeps their order), so it does not run the check that ckpt.pth does not exist yet,
    which it would fail."""
    if hvd.rank() == 0:
        try:
            rundir.preflight(args, True)
            start = checkpoints.restore(args, model, optimizer)
            rundir.hold(args)  # from here on, this run writes into its folder
            return start, None
        except TrainerError as e:
            return checkpoints.fresh_start(args), e
    return checkpoints.fresh_start(args), None


@hvd.elastic.run
def run_epochs(state, worker, train_model, optimizer, scaler, schedule):
    """The epochs from the last commit to the end, in the current world; Horovod runs it
    again after a change of the world. Here every worker holds rank 0's committed state."""
    args, world = worker.args, worker.world
    if state.error is not None:
        if world.is_rank0 or isinstance(state.error, UsageError):
            raise state.error  # a usage error is printed by rank 0 alone
        raise TrainerError("stopping because rank 0 could not start the run (its error is above)")
    if not state.optimizer_state:
        # The sync of a fresh optimizer takes a step of zero gradients to create its
        # state, which leaves weight decay in SGD's momentum; main_horovod.py has none.
        optimizer.state.clear()
    if scaler.is_enabled() and state.scaler:
        scaler.load_state_dict(state.scaler)
    schedule.load_state_dict(state.schedule)
    schedule.scale = world.lr_scale  # linear scaling by this world's size
    log = worker.start(state.epoch, state.history, state.tracking)
    # The MLflow run rank 0 logs to, on every worker: a later rank 0 continues it.
    state.tracking = hvd.broadcast_object(log.tracking, 0, name="tracking")
    train_loader, test_loader = worker.loaders
    # Elastic: main.py's loop from the last commit, on the committed state
    model, best_acc, reports = state.model, state.best_acc, world.is_rank0
    for epoch in range(state.epoch, cli.last_epoch(args)):
        if utils.target_reached(args, log.history):  # --target-acc: an epoch reached it
            break
        # Elastic: profiled, the first epoch this process trains (it may join late)
        train, test, seconds = utils.train_and_test(train_model, model, train_loader, test_loader,
                                                    optimizer, scaler, schedule, epoch, args, world,
                                                    profile=epoch == worker.first_epoch)
        is_best, best_acc = test["acc"] > best_acc, max(best_acc, test["acc"])
        history = log.add(epoch, train, test, seconds)  # the epoch's line and metrics row
        # Elastic: the MLflow run as this world's rank 0 had it at the world's start
        ckpt = checkpoints.checkpoint_state(args, model, optimizer, scaler, schedule, epoch + 1,
                                            best_acc, world.size, history, state.tracking)
        with launch.stops_held():  # a stop signal waits for both
            checkpoints.save(args, ckpt, is_best, reports)
            log.write()  # metrics.csv after the checkpoint that holds its rows
        # Elastic: commit the epoch, in new objects (commit keeps references); a change of
        # hosts raises HostsUpdatedInterrupt here, and the next world starts at the next epoch
        state.epoch, state.best_acc, state.history = epoch + 1, best_acc, history
        state.scaler, state.optimizer_state = scaler.state_dict(), True
        state.commit()
    worker.close_log(final=True)
    return log.history


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


class Worker:
    """This process across the worlds it trains in: what depends on its rank and the world's
    size is made at the start and again after every reset (the reset callback runs before the
    state sync, so it uses no synced value)."""

    def __init__(self, args, device):
        self.args, self.device = args, device
        self.cores = devices.starting_cores()  # shared anew among each world's local ranks
        # Horovod's threads of the first world get the cores' spare time, as in main_horovod.py;
        # a reset starts new ones, which run at normal priority.
        self.spare = devices.other_threads()
        self.sets = None  # (train, test) arrays, set once loaded
        self.world = self.loaders = self.log = None
        self.size = None  # the size of the last world that trained
        self.first_epoch = None  # the first epoch this process trains, profiled once

    def reset(self):
        devices.share_cores(self.device, hvd.local_rank(), hvd.local_size(), self.spare, self.cores)
        # main_horovod.py's world, of this size (Adasum cannot arise: cli refuses it here)
        self.world = utils.World.of(self.args, rank=hvd.rank(), size=hvd.size(),
                                    allreduce=lambda t: hvd.allreduce(t, op=hvd.Sum))
        self.loaders = None  # free the old loaders' copies before building the new ones
        self.loaders = utils.make_loaders(self.args, *self.sets, self.device, self.world)
        self.close_log()  # rank 0 may be another process now

    def start(self, epoch, history, tracking):
        """This world begins training at `epoch` with the committed history: its RunLog."""
        if self.first_epoch is None:
            self.first_epoch = epoch
        if self.world.is_rank0 and self.size not in (None, self.world.size):
            print(f"elastic: world size {self.size} -> {self.world.size}; "
                  f"continuing at epoch {epoch + 1}", flush=True)
        self.size = self.world.size
        self.close_log()
        self.log = runlog.RunLog(self.args, self.world.is_rank0, self.world.size, history, epoch,
                                 tracking)
        return self.log

    def close_log(self, final=False):
        if self.log is not None:
            self.log.close(final)
        self.log = None


if __name__ == "__main__":
    sys.exit(launch.run_cli(main))
