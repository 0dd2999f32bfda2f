"""How much of the gradient allreduce overlaps the backward pass, for either port, eager or
under --compile.

    horovodrun -np 2 --gloo python -m benchmarks.diagnostics.overlap main_horovod.py [trainer flags]
    torchrun --standalone --nproc_per_node 2 -m benchmarks.diagnostics.overlap main_ddp.py [trainer flags]

Runs the trainer's main() in this process with timing probes and nothing else changed:
every parameter's post-accumulate-grad hook records when its gradient is ready (the moment the
port's own hook sees it), Tensor.backward when a backward pass starts and returns, and Horovod's
synchronize() when the reduction has ended (DDP's ends inside backward, which waits for its
buckets). Per step, after the first `--skip` steps (compilation, warm-up):

  compute_ms   from the start of backward to the last gradient ready
  spread_ms    from the first gradient ready to the last: the window in which a reduction can
               run beside the backward at all (0 where every gradient comes at once)
  exposed_ms   from the last gradient ready to the reduction's end: what the step waits for

After training, each rank times the same gradients' reduction with nothing else running
(`alone_ms`, median of 10): Horovod's grouped allreduce of every gradient, or torch.distributed
allreduces in DDP's bucket sizes (1 MiB, then 25 MiB). The overlap is 1 - exposed / alone,
at least 0: the share of the reduction that the backward hid. Rank 0 prints one JSON line.
Gradient accumulation (--batches-per-allreduce > 1) is refused: a step would have several
backward passes.
"""
import importlib
import json
import statistics
import sys
import time

import torch

import utils

SKIP = 5


class Probe:
    def __init__(self):
        self.steps = []  # per backward pass: {"start", "end", "ready": [...], "reduced"}

    def backward(self, original):
        def timed(tensor, *args, **kwargs):
            step = {"start": time.perf_counter(), "ready": []}
            self.steps.append(step)
            try:
                return original(tensor, *args, **kwargs)
            finally:
                step["end"] = step["reduced"] = time.perf_counter()
        return timed

    def ready(self, param):
        if self.steps:
            self.steps[-1]["ready"].append(time.perf_counter())

    def optimizer_step(self, original):
        def timed(optimizer, *args, **kwargs):
            sync = getattr(optimizer, "synchronize", None)
            if sync is not None and not getattr(sync, "probed", False):
                def synchronize():
                    sync()
                    if self.steps:
                        self.steps[-1]["reduced"] = time.perf_counter()
                synchronize.probed = True
                optimizer.synchronize = synchronize
            return original(optimizer, *args, **kwargs)
        return timed

    def figures(self, skip):
        rows = [s for s in self.steps[skip:] if s["ready"]]
        ms = 1e3
        return {"steps": len(rows),
                "compute_ms": statistics.median((max(s["ready"]) - s["start"]) * ms for s in rows),
                "spread_ms": statistics.median((max(s["ready"]) - min(s["ready"])) * ms for s in rows),
                "exposed_ms": statistics.median(max(0.0, s["reduced"] - max(s["ready"])) * ms
                                                for s in rows)}


def alone_ms(script, model, repeats=10):
    """The median time of the gradients' reduction with nothing else running, as the port would
    reduce them (see the module's docstring)."""
    grads = [torch.randn_like(p) for p in model.parameters() if p.requires_grad]
    times = []
    if script == "main_horovod.py":
        import horovod.torch as hvd
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            hvd.grouped_allreduce(grads, name=f"overlap_alone_{i}")
            times.append(time.perf_counter() - t0)
    else:
        import torch.distributed as dist
        flat = torch.cat([g.flatten() for g in reversed(grads)])  # DDP fills buckets from the end
        first, cap = (1 << 20) // 4, (25 << 20) // 4  # float32 elements
        sizes = [min(first, len(flat))]
        while sum(sizes) < len(flat):
            sizes.append(min(cap, len(flat) - sum(sizes)))
        for _ in range(repeats + 1):
            dist.barrier()
            t0 = time.perf_counter()
            works = [dist.all_reduce(part, async_op=True) for part in flat.split(sizes)]
            for w in works:
                w.wait()
            times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]) * 1e3


def main(argv):
    script, flags = argv[0], argv[1:]
    if "--batches-per-allreduce" in flags and flags[flags.index("--batches-per-allreduce") + 1] != "1":
        print("benchmarks.diagnostics.overlap: one backward pass per step; drop --batches-per-allreduce",
              file=sys.stderr)
        return 2
    probe = Probe()
    torch.Tensor.backward = probe.backward(torch.Tensor.backward)
    utils.optimizer_step = probe.optimizer_step(utils.optimizer_step)
    build = utils.build_model

    def probed_model(*args, **kwargs):
        model = build(*args, **kwargs)
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(probe.ready)
        return model
    utils.build_model = probed_model
    trainer = importlib.import_module(script.removesuffix(".py"))
    model, _ = trainer.main(flags)
    out = dict(probe.figures(SKIP), script=script, compiled="--compile" in flags,
               alone_ms=alone_ms(script, model))
    out["overlap"] = max(0.0, 1 - out["exposed_ms"] / out["alone_ms"]) if out["alone_ms"] else None
    if script == "main_ddp.py":
        import torch.distributed as dist
        rank = dist.get_rank()
        dist.destroy_process_group()
    else:
        import horovod.torch as hvd
        rank = hvd.rank()
    if rank == 0:
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
