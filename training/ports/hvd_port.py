"""What the Horovod ports ask of Horovod beyond its own defaults: the settings it starts with on
CUDA, how the gradients reach its allreduce and the compression they go through, and Adasum's
limits and LR scale. Horovod is imported only where it is used.

- **Settings** (`apply`, before hvd.init(), which reads them once), on CUDA only and only where
  the environment holds none: HOROVOD_ENABLE_ASYNC_COMPLETION=1, so that a step's synchronize()
  waits on a CUDA event in the stream instead of holding the host until the GPU has run the
  backward; HOROVOD_CYCLE_TIME=0.1 (ms; Horovod's own is 1), since a gradient ready just after a
  cycle waits for the next, and a GPU step takes a few ms. On the CPU the collectives complete
  on the host anyway, and every wait for one polls it, sleeping between polls (`_polled_waits`).
  docs/PERFORMANCE.md has what each is worth.
- **Compression**: `layout.GradLayout` hands Horovod a channels_last gradient's contiguous view,
  around Horovod's fp16 compression (--fp16-allreduce) or none.
- **How gradients reach Horovod** (--grad-allreduce, `grad_path`): "hooks", DistributedOptimizer's
  hook per gradient as backward makes it; "one" (`OneAllreduce`), after the backward every
  gradient in one flat buffer and one allreduce, the same average (bitwise the hooks' at two
  processes) without a request per tensor, for a model compiled whole, whose hooks would fire
  only after its backward; "regions", the hooks on a model compiled block by block, so that a
  block's allreduce runs beside the blocks still to come. `grad_path` picks hooks eager, and
  under --compile one on a single host, regions across hosts or where the reduction is per
  tensor (--allreduce-groups, Adasum).
- **Adasum** (--use-adasum) sums the ranks' gradients adaptively instead of averaging them, so
  the LR is not multiplied by the number of processes (by the processes of a host where Horovod
  first sums within hosts, on GPUs with NCCL). Horovod's MPI controller only, at power-of-two
  world sizes.
"""
import contextlib
import os
import time

import torch

from training.base import layout
from training.base.errors import UsageError

CUDA_DEFAULTS = {"HOROVOD_ENABLE_ASYNC_COMPLETION": "1", "HOROVOD_CYCLE_TIME": "0.1"}
# The cycle Horovod runs with, in seconds: on CUDA (the default above), else its own.
CYCLE_S = {True: 1e-4, False: 1e-3}


def defaults(cuda):
    """The settings the ports give Horovod on this kind of device."""
    return dict(CUDA_DEFAULTS) if cuda else {}


def apply(cuda=None):
    """Put the defaults for this machine (CUDA where torch sees a GPU) into the environment
    where it has none of its own, before hvd.init() reads it; on the CPU, wait for collectives by
    polling (`_polled_waits`). Returns what was set in the environment."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    given = {k: v for k, v in defaults(cuda).items() if k not in os.environ}
    os.environ.update(given)
    if not cuda:
        _polled_waits()
    return given


def _polled_waits():
    """Every wait for a Horovod collective (hvd.synchronize: the optimizer's, a broadcast's, a
    metric's allreduce) polls it and sleeps between polls, 20 us at first, doubling up to a cycle
    of Horovod's (1 ms on the CPU), then takes the result as Horovod would. Horovod's own wait
    loops on sched_yield: with more processes than cores, that loop holds a core that the
    background threads, which complete the collective, are waiting for."""
    import horovod.torch as hvd
    from horovod.torch import functions, mpi_ops, optimizer, sync_batch_norm
    native = mpi_ops.synchronize
    if getattr(native, "polled", False):
        return

    def synchronize(handle):
        delay = 2e-5
        while handle in mpi_ops._handle_map and not mpi_ops.poll(handle):
            time.sleep(delay)
            delay = min(2 * delay, CYCLE_S[False])
        return native(handle)
    synchronize.polled, synchronize.__wrapped__ = True, native
    for module in (mpi_ops, hvd, optimizer, functions, sync_batch_norm):  # each holds the name
        module.synchronize = synchronize



def compression(fp16):
    """The compression DistributedOptimizer is given: GradLayout around fp16's or none."""
    import horovod.torch as hvd
    return layout.GradLayout(hvd.Compression.fp16 if fp16 else hvd.Compression.none)


def check_adasum(args):
    """Adasum's limits for this job (nothing without --use-adasum): one line each. Horovod must
    have been initialized."""
    if args.use_adasum:
        import horovod.torch as hvd
        check(hvd.size(), hvd.mpi_enabled())


def check(size, mpi_enabled):
    """Adasum's limits, for a world of `size` processes: one line each."""
    if not mpi_enabled:
        raise UsageError("--use-adasum needs Horovod's MPI controller: launch with horovodrun "
                         "--mpi or mpirun")
    if size & (size - 1):
        raise UsageError(f"--use-adasum needs a power-of-two number of processes, not {size}")


def lr_size(args):
    """What the LR is multiplied by under --use-adasum (before --batches-per-allreduce): the
    local size where Horovod's NCCL sums within a host first (on GPUs), else 1. None without
    --use-adasum: the world size, as for an average. Horovod must have been initialized."""
    if not args.use_adasum:
        return None
    import horovod.torch as hvd
    return hvd.local_size() if torch.cuda.is_available() and hvd.nccl_built() else 1


def grad_path(args):
    """hooks, one or regions: --grad-allreduce, or what auto means for this job (the module's
    docstring). Horovod must have been initialized."""
    if args.grad_allreduce != "auto":
        return args.grad_allreduce
    if not args.compile:
        return "hooks"
    import horovod.torch as hvd
    per_tensor = args.use_adasum or args.allreduce_groups is not None
    return "regions" if per_tensor or hvd.cross_size() > 1 else "one"


def _flat_view(t):
    """(t's elements as a 1-D view in memory order, how to lay a 1-D tensor out as t): a
    channels_last tensor goes by its contiguous NHWC view, so no byte is copied."""
    if t.is_contiguous():
        return t.view(-1), lambda flat: flat.view(t.shape)
    nhwc = t.permute(layout.NHWC)
    if nhwc.is_contiguous():
        return nhwc.reshape(-1), lambda flat: flat.view(nhwc.shape).permute(layout.NCHW)
    return t.reshape(-1), lambda flat: flat.view(t.shape)


class _OneAllreduce:
    """The methods OneAllreduce gives a class of its own over the wrapped optimizer's class (so
    each names that class, self.__class__, in super(), as Horovod's DistributedOptimizer does)."""

    def __init__(self, optimizer, compression, op):
        super(self.__class__, self).__init__(optimizer.param_groups)
        # the wrapped class's __init__ sees only the groups; a fused SGD's flag comes with it
        self._step_supports_amp_scaling = optimizer._step_supports_amp_scaling
        self._compression, self._op = compression, op
        self._skip_sync = False

    def _reduces(self):
        import horovod.torch as hvd
        # as DistributedOptimizer registers its hooks: more than one process, or elastic mode
        return hvd.size() > 1 or os.environ.get("HOROVOD_ELASTIC") == "1"

    def synchronize(self):
        """Every gradient averaged over the ranks, in one allreduce per dtype and device; a
        parameter without a gradient takes part with zeros, as under DistributedOptimizer."""
        if not self._reduces():
            return
        import horovod.torch as hvd
        params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        by_kind = {}
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            by_kind.setdefault((p.grad.dtype, p.grad.device), []).append(p)
        pending = []
        for (dtype, _), group in by_kind.items():
            views = [_flat_view(p.grad) for p in group]
            flat = torch.cat([v for v, _ in views])
            sent, ctx = self._compression.compress(flat)
            name = f"one_allreduce.{str(dtype).split('.')[-1]}.{len(pending)}"
            pending.append((hvd.allreduce_async_(sent, name=name, op=self._op), ctx, group, views))
        for handle, ctx, group, views in pending:
            flat = self._compression.decompress(hvd.synchronize(handle), ctx)
            parts = flat.split([p.grad.numel() for p in group])
            for p, part, (_, shape) in zip(group, parts, views):
                p.grad = shape(part)

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() without its synchronize(), after an explicit one (DistributedOptimizer's)."""
        self._skip_sync = True
        try:
            yield
        finally:
            self._skip_sync = False

    def step(self, closure=None):
        if not self._skip_sync:
            self.synchronize()
        return super(self.__class__, self).step(closure)


def distributed_optimizer(args, model, optimizer, grad_path="hooks"):
    """The Horovod port's optimizer: Adasum's limits checked (check_adasum), then
    wrap_optimizer with the flags' settings."""
    check_adasum(args)
    return wrap_optimizer(model, optimizer, fp16=args.fp16_allreduce, groups=args.allreduce_groups,
                          batches=args.batches_per_allreduce, adasum=args.use_adasum,
                          grad_path=grad_path)


def wrap_optimizer(model, optimizer, fp16=False, groups=None, batches=1, adasum=False,
                   grad_path="hooks"):
    """`optimizer` with its gradients averaged over the ranks (Adasum where asked) every
    `batches` backward passes: from backward's hooks (hvd.DistributedOptimizer), or in one
    allreduce after it (grad_path "one": OneAllreduce), as contiguous views. The fused step's
    flag, which the wrapper drops, is given back, so that GradScaler reads nothing per step."""
    import horovod.torch as hvd
    wrapper = OneAllreduce if grad_path == "one" else hvd.DistributedOptimizer
    wrapped = wrapper(optimizer, named_parameters=model.named_parameters(), groups=groups,
                      compression=compression(fp16), backward_passes_per_step=batches,
                      op=hvd.Adasum if adasum else hvd.Average)
    wrapped._step_supports_amp_scaling = optimizer._step_supports_amp_scaling
    return wrapped


def OneAllreduce(optimizer, named_parameters, compression, op, groups=None,
                 backward_passes_per_step=1):
    """`optimizer` with hvd.DistributedOptimizer's face (synchronize, skip_synchronize, step) and
    one allreduce of every gradient in synchronize() instead of a hook per tensor. Takes
    DistributedOptimizer's arguments: groups must be None (one request is one group), and the
    backward passes per step need no count (they add into .grad; the step reduces once).
    Like DistributedOptimizer, it reduces only where there is more than one process or
    HOROVOD_ELASTIC=1 is set (benchmarks/diagnostics/hooks_on.py)."""
    import horovod.torch as hvd
    if groups is not None or op == hvd.Adasum:
        raise UsageError("one allreduce of every gradient has no groups and no Adasum: "
                         "use --grad-allreduce hooks or regions")
    del named_parameters, backward_passes_per_step  # no hooks, no count (docstring)
    methods = {k: v for k, v in vars(_OneAllreduce).items() if k not in ("__dict__", "__weakref__")}
    # hvd.broadcast_optimizer_state makes a fresh optimizer's state with one step on the ranks
    # that have none, and runs that step without its reduction, which the other ranks would never
    # join, for the optimizers of DistributedOptimizer's module: this one has that module's face.
    methods["__module__"] = hvd.DistributedOptimizer.__module__
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), methods)
    return cls(optimizer, compression, op)


def replace_batchnorm(module, factory):
    """Swap every BatchNorm2d for factory(num_features, ...), keeping its state: the port's
    --sync-bn, with hvd.SyncBatchNorm."""
    for name, child in module.named_children():
        if isinstance(child, torch.nn.BatchNorm2d):
            new = factory(child.num_features, eps=child.eps, momentum=child.momentum,
                          affine=child.affine, track_running_stats=child.track_running_stats)
            new.load_state_dict(child.state_dict())
            setattr(module, name, new.to(next(child.buffers()).device))
        else:
            replace_batchnorm(child, factory)
    return module
