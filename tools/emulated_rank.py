"""One rank of an emulated cluster (tools/emulate.py starts them): the real port and the real
allreduce, with every layer's arithmetic replaced by a sleep of its measured time.

    horovodrun -np N ... python -m tools.emulated_rank --port horovod --plan PLAN.json --out OUT.json
    torchrun ... -m tools.emulated_rank --port ddp --plan PLAN.json --out OUT.json

The model (`SleepingModel`) holds the real model's parameters, with their shapes, names and
order, and builds a chain of one autograd node per layer of a layer profile
(tools/layer_profile.py). A node's forward sleeps the layer's forward time; its backward sleeps
until the layer's gradients would be ready, then returns them, so autograd accumulates them and
the port's hooks fire in the real backward order at the profiled times. Under `compiled` (what
--compile does) the gradients come when the compiled graph that makes them ends: for Horovod the
first node of the backward sleeps the whole backward pass and every gradient comes after it at
once, or, compiled "regions" (--grad-allreduce regions), each block's when that block ends;
DDP's compiled wrapper is one graph per bucket, whose gradients come together. The
optimizer (`SleepingOptimizer`) sleeps the step's time. Nothing else is replaced: Horovod's
DistributedOptimizer as main_horovod.py wraps it (hvd_port.wrap_optimizer) with its hooks, cycles
and fusion, or DistributedDataParallel as main_ddp.py wraps it (process_group.distributed_model)
with its buckets, over gloo, and the engine's
optimizer_step. A `hierarchical` case (Horovod, compiled) stands for
HOROVOD_HIERARCHICAL_ALLREDUCE, which gloo lacks: after the backward pass every gradient goes in
one flat buffer, as the compiled backward's one fused message, summed by the steps of the
hierarchical allreduce made of Horovod's collectives over each host's and the cross-host process
sets (tools.allreduce.hierarchical; `Composed`).

Time is dilated by the plan's factor D: every sleep lasts D times the profiled time, and the
launcher has divided the link rates by D and multiplied Horovod's cycle time by D. The rank
reports times divided by D. A sleeping rank uses no core: what CPU it uses is the allreduce's
and the loop's, which rank 0 reports with the step times.

The plan is JSON: {"dilation": D, "cases": [{"name", "profile", "k", "fp16", "compiled",
"steps", "warmup", "hierarchical" (optional)}, ...]}, each case run in turn with a model and optimizer of its own.
Rank 0 writes {"cases": [{name, step_s, steps_s, phases_s, wall_s, cpu_s, rss_mb, private_mb}]}:
times in emulated seconds, except wall_s (real seconds of the timed steps), and every rank's
CPU seconds over them and memory. step_s is the mean of the timed steps, each phase the median.
"""
import argparse
import contextlib
import json
import os
import resource
import socket
import statistics
import sys
import time

import torch

import models
from tools import allreduce, layer_profile, scaling_model
from training.run.phases import PhaseTimer
import utils

# How often a rank looks whether its allreduces have ended: 10 us of emulated time, at least
# every 0.2 ms of real time (the resolution this adds to a step).
POLL_S, MIN_POLL_S = 10e-6, 0.2e-3


class Clock:
    """When one forward and backward pass should reach each layer: deadlines from the pass's
    start, in dilated seconds. The backward pass starts when its first node runs."""

    def __init__(self, forward_at, backward_at, backward_total, dilation):
        self.forward_at, self.backward_at, self.backward_total = forward_at, backward_at, backward_total
        self.dilation = dilation
        self.start = time.perf_counter()
        self.backward_start = None

    def forward_done(self, j):
        _sleep_until(self.start + self.forward_at[j] * self.dilation)

    def backward_done(self, j):
        """Layer j's gradients are ready (j = -1: the tail after the last layer)."""
        if self.backward_start is None:
            self.backward_start = time.perf_counter()
        at = self.backward_total if j < 0 else self.backward_at[j]
        _sleep_until(self.backward_start + at * self.dilation)


def release_times(profile, compiled=False, port="horovod"):
    """When in the backward pass each layer (forward order) hands over its gradients, in
    profiled seconds: as it finishes; under `compiled`, Horovod's all when the compiled
    backward ends, DDP's at the end of the graph of their bucket (DDPOptimizer splits a
    compiled DDP model at its buckets); under compiled "regions", each when its region's graph
    ends (utils.compiled_regions)."""
    layers = profile["layers"]
    total = sum(layer["backward_s"] for layer in layers) + profile["tail_s"]
    done = list(reversed(_cumulative([layer["backward_s"] for layer in reversed(layers)])))
    if not compiled:
        return done, total
    if compiled == "regions":  # by regions: each region's gradients when its graph ends
        return layer_profile.region_ends(profile, done), total
    if port == "horovod":
        return [total] * len(layers), total
    order = list(reversed(range(len(layers))))  # backward order
    sizes = [(j, b) for j in order for b in layers[j]["bytes"]]
    bucket_of = {}
    for (j, _), bucket in zip(sizes, scaling_model.ddp_buckets([b for _, b in sizes])):
        bucket_of[j] = bucket  # a layer goes with the bucket of its last tensor
    ends = {}
    for j in order:
        ends[bucket_of[j]] = max(ends.get(bucket_of[j], 0.0), done[j])
    return [ends[bucket_of[j]] for j in range(len(layers))], total


def _cumulative(xs):
    out, t = [], 0.0
    for x in xs:
        t += x
        out.append(t)
    return out


def _sleep_until(deadline):
    # Deadlines, not durations: a late wake-up does not delay the layers after it.
    left = deadline - time.perf_counter()
    if left > 0:
        time.sleep(left)


class _Layer(torch.autograd.Function):
    """One layer: forward sleeps until its forward time is spent, backward until its gradients
    are ready, then hands autograd a gradient for each of its parameters."""

    @staticmethod
    def forward(ctx, carrier, model, clock, j, *params):
        ctx.model, ctx.clock, ctx.j = model, clock, j
        if j >= 0:
            clock.forward_done(j)
        return carrier.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.clock.backward_done(ctx.j)
        return (grad, None, None, None, *ctx.model.gradients(ctx.j))


class SleepingModel(torch.nn.Module):
    """The real model's parameters (`net`, unused in forward) under a chain of sleeping layers
    from `profile`; forward(x) returns a scalar whose backward releases the gradients."""

    def __init__(self, profile, dilation=1.0, compiled=False, port="horovod"):
        super().__init__()
        self.net = models.get_model(profile["arch"], num_classes=10)
        for p in self.net.parameters():  # no arithmetic on them, and none to make them
            p.data = torch.zeros_like(p)
        params = dict(self.net.named_parameters())
        self.layers = [[params[name] for name in layer["params"]] for layer in profile["layers"]]
        missing = set(params) - {n for layer in profile["layers"] for n in layer["params"]}
        if missing:
            raise ValueError(f"the profile of {profile['arch']} lacks parameters {sorted(missing)[:3]}")
        self.forward_at = _cumulative([layer["forward_s"] for layer in profile["layers"]])
        self.backward_at, self.backward_total = release_times(profile, compiled, port)
        self.dilation = dilation
        # Gradients handed to autograd: a parameter's last one comes back (recycle) for its next
        # first pass, which autograd then keeps as .grad without a copy; later passes of a step
        # (--batches-per-allreduce) add a zero tensor of their own.
        self.spare = {id(p): torch.zeros_like(p) for p in self.parameters()}
        self.addend = {}

    def forward(self, x):
        clock = Clock(self.forward_at, self.backward_at, self.backward_total, self.dilation)
        # The tail node, first in the chain, runs last in the backward pass: the time the backward
        # goes on after the last gradient is ready. x needs a gradient for the node to run.
        h = _Layer.apply(x.detach().requires_grad_(), self, clock, -1)
        for j, params in enumerate(self.layers):
            h = _Layer.apply(h, self, clock, j, *params)
        return h

    def gradients(self, j):
        if j < 0:
            return []
        out = []
        for p in self.layers[j]:
            g = self.spare.pop(id(p), None)
            if g is None or p.grad is not None:
                if g is not None:
                    self.spare[id(p)] = g
                g = self.addend.setdefault(id(p), torch.zeros_like(p))
            out.append(g)
        return out

    def recycle(self):
        """Take back every .grad for the next step and clear it (zero_grad's set_to_none)."""
        for p in self.parameters():
            if p.grad is not None:
                self.spare[id(p)] = p.grad
                p.grad = None


class SleepingOptimizer(torch.optim.Optimizer):
    """An optimizer whose step sleeps the profiled step time (dilated) and changes nothing."""
    _step_supports_amp_scaling = False

    def __init__(self, params, step_s=0.0):
        super().__init__(params, {"step_s": step_s})

    def step(self, closure=None):
        time.sleep(self.param_groups[0]["step_s"])

    def zero_grad(self, set_to_none=True):
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None


def poll_asleep(hvd, handles, dilation):
    """Until Horovod's `handles` have ended, asleep between looks (POLL_S of emulated time)."""
    while not all(hvd.poll(h) for h in handles):
        time.sleep(max(POLL_S * dilation, MIN_POLL_S))


class Composed:
    """The optimizer behind the hierarchical allreduce composed of Horovod's collectives: its
    synchronize() (what the engine's optimizer_step calls first) puts every gradient in one
    flat buffer, sums it over the ranks (tools.allreduce.hierarchical, each collective waited
    for asleep), and puts the average back; step() is the optimizer's."""
    _handles = {}  # none for Port.wait_asleep: synchronize() waits for its own

    def __init__(self, optimizer, hvd, sets, dilation):
        if sets is None:
            raise ValueError("a hierarchical case needs 2 or more hosts of the same number (2 or more) of ranks")
        self.optimizer, self.hvd, (self.node, self.cross) = optimizer, hvd, sets
        self.param_groups, self.dilation = optimizer.param_groups, dilation

    def _wait(self, handle):
        poll_asleep(self.hvd, [handle], self.dilation)
        return self.hvd.synchronize(handle)

    def synchronize(self):
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        flat = allreduce.hierarchical(self.hvd, torch.cat([g.reshape(-1) for g in grads]), self.node, self.cross,
                                      wait=self._wait, name="emulate.hier")
        flat.div_(self.hvd.size())
        at = 0
        for g in grads:
            g.copy_(flat[at:at + g.numel()].view_as(g))
            at += g.numel()

    @contextlib.contextmanager
    def skip_synchronize(self):
        yield

    def step(self, closure=None):
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none)


class Port:
    """What differs between Horovod and DDP for the loop: the job, the wrapped model and
    optimizer, and the collectives the loop itself uses (barrier, gathering to rank 0).
    `hierarchical`: Horovod with dynamic process sets, and the node and cross-node sets of the
    hierarchical allreduce (tools.allreduce.node_sets; None where the hosts do not make them)."""

    def __init__(self, name, hierarchical=False):
        self.name, self.sets = name, None
        if name == "horovod":
            import horovod.torch as hvd
            hvd.init(**({"process_sets": "dynamic"} if hierarchical else {}))
            self.hvd, self.rank, self.size = hvd, hvd.rank(), hvd.size()
            if hierarchical:
                self.sets = allreduce.node_sets(hvd, hvd.allgather_object(socket.gethostname()))
        else:
            import torch.distributed as dist

            from training.ports import process_group
            process_group.join_job(torch.device("cpu"))
            self.dist, self.rank, self.size = dist, dist.get_rank(), dist.get_world_size()

    def wrap(self, model, optimizer, case, dilation=1.0):
        """(the model the loop calls, the optimizer it steps), as the real port makes them."""
        if case.get("hierarchical"):
            return model, Composed(optimizer, self.hvd, self.sets, dilation)
        if self.name == "horovod":
            from training.ports import hvd_port
            return model, hvd_port.wrap_optimizer(model, optimizer, fp16=case["fp16"],
                                                  batches=case["k"])
        from training.ports import process_group
        return process_group.distributed_model(model), optimizer

    def wait_asleep(self, optimizer, dilation):
        """Horovod: wait for the step's allreduces asleep, polling, before synchronize() does.
        synchronize() spins (sched_yield) until they end, which on a GPU host costs a core that
        nothing else needs; here it would take the cores that the allreduces run on. DDP waits
        on a condition inside backward()."""
        if self.name != "horovod":
            return
        poll_asleep(self.hvd, [h for h, _ in optimizer._handles.values() if h is not None], dilation)

    def barrier(self):
        if self.name == "horovod":
            self.hvd.barrier()
        else:
            self.dist.barrier()

    def gather(self, obj):
        if self.name == "horovod":
            return self.hvd.allgather_object(obj)
        out = [None] * self.size
        self.dist.all_gather_object(out, obj)
        return out

    def leave(self):
        if self.name == "ddp":
            from training.ports import process_group
            process_group.leave_job()


def run_case(port, case, dilation):
    """Time `case`'s steps on this rank; rank 0 gets every rank's CPU and memory too."""
    profile = case["profile"]
    model = SleepingModel(profile, dilation, case["compiled"], port.name)
    optimizer = SleepingOptimizer(model.parameters(), profile["optimizer_s"] * dilation)
    train_model, optimizer = port.wrap(model, optimizer, case, dilation)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    x = torch.zeros(())
    k, ddp = case["k"], port.name == "ddp"
    timer = PhaseTimer(case["warmup"] + case["steps"])
    steps, cpu0, wall0 = [], None, None
    port.barrier()
    for step in range(case["warmup"] + case["steps"]):
        if step == case["warmup"]:
            cpu0, wall0 = _cpu_s(), time.perf_counter()
        timer.start_step(step)
        t0 = time.perf_counter()
        model.recycle()
        optimizer.zero_grad()
        for i in range(k):
            hold = ddp and i + 1 < k  # DDP: the first k - 1 passes accumulate locally
            with train_model.no_sync() if hold else contextlib.nullcontext():
                with timer.phase("forward"):
                    out = train_model(x)
                with timer.phase("backward"):
                    out.backward()
        with timer.phase("allreduce-wait"):
            port.wait_asleep(optimizer, dilation)
        utils.optimizer_step(optimizer, scaler, timer)
        steps.append(time.perf_counter() - t0)
    cpu, wall = _cpu_s() - cpu0, time.perf_counter() - wall0
    ranks = port.gather({"cpu_s": cpu, **_memory_mb()})
    measured = steps[case["warmup"]:]
    phases = {p: statistics.median(v[case["warmup"]:]) / dilation for p, v in timer.times.items()}
    # The mean, not the median: a rate. With Horovod's cycle a step lasts a whole number of cycles
    # more or less, so a median of a few steps lands on one of them; their mean is what the steps
    # take on average, what the scaling model predicts.
    return {"name": case["name"], "step_s": statistics.fmean(measured) / dilation,
            "steps_s": [s / dilation for s in measured], "phases_s": phases, "wall_s": wall,
            "cpu_s": [r["cpu_s"] for r in ranks], "rss_mb": [r["rss_mb"] for r in ranks],
            "private_mb": [r["private_mb"] for r in ranks]}


def _cpu_s():
    """This process's CPU seconds, every thread, user and system."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _memory_mb():
    """This process's memory now: resident (shared library pages included, which every rank
    shares) and its own (private pages: what one more rank costs), in MB."""
    out = {"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "private_mb": None}
    try:
        with open("/proc/self/smaps_rollup") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line and not line.startswith(" "))
        out["private_mb"] = sum(int(fields[k].split()[0]) for k in ("Private_Clean", "Private_Dirty")) / 1024
    except (OSError, KeyError, ValueError):  # not Linux, or an older kernel
        pass
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", choices=("horovod", "ddp"), required=True)
    p.add_argument("--plan", required=True, help="the plan's JSON file")
    p.add_argument("--out", required=True, help="where rank 0 writes the results (JSON)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # a sleeping rank needs none; the allreduce's threads are its own
    with open(args.plan) as f:
        plan = json.load(f)
    port = Port(args.port, any(case.get("hierarchical") for case in plan["cases"]))
    try:
        results = [run_case(port, case, plan["dilation"]) for case in plan["cases"]]
    finally:
        port.leave()
    if port.rank == 0:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"size": port.size, "port": args.port, "cases": results}, f)
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
