"""A look inside the training step: one trainer run under torch.profiler, for
benchmarks/gpu/trace_report.py to read.

    python -m benchmarks.gpu.step_trace OUT NAME main.py [trainer flags]
    torchrun --nproc_per_node 1 -m benchmarks.gpu.step_trace OUT NAME main_ddp.py [flags]
    horovodrun -np 1 --gloo python -m benchmarks.gpu.step_trace OUT NAME main_horovod.py [flags]

Runs the trainer's main() in this process with nothing changed but the profiler around its
steps: `--wait` steps untraced (compiling, CUDA-graph recording), `--warmup` steps warming the
profiler, then `--active` steps traced (CPU and CUDA activity, no shapes, no stacks), written
to OUT/NAME.trace.json.gz, a Chrome trace. The run ends there, before its evaluation and
checkpoint. Also written: OUT/NAME.counters.json, the compiler's own counters
(torch._dynamo.utils.counters: CUDA-graph skips and re-recordings are inductor's), and the
run's output, which says more where TORCH_LOGS is set (commands.sh sets
"cudagraphs,recompiles,graph_breaks,perf_hints").

Under main_horovod.py, Horovod's gradient reduction is forced on at one process, as
benchmarks/diagnostics/hooks_on.py does, and its Python entry points (allreduce_async_,
synchronize, the optimizer's synchronize) are labelled in the trace as `hvd.<name>`, so the
report can name the host calls that lie over the GPU's idle time. No HOROVOD_TIMELINE: it
makes the host wait. Benchmarks only: the trainers never run it.
"""
import argparse
import functools
import importlib
import json
import os
import sys

import torch

import utils


class StepsDone(Exception):
    """Raised after the traced steps: the run has given what it was started for."""


def labelled(name, fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        with torch.profiler.record_function(name):
            return fn(*args, **kwargs)
    return call


def label_horovod():
    """Horovod's Python calls, as named ranges in the trace; its reduction on at one process."""
    import horovod.torch as hvd
    import horovod.torch.mpi_ops as ops
    import horovod.torch.optimizer as opt
    for module in (hvd, ops, opt):
        for name in ("allreduce_async_", "synchronize", "grouped_allreduce_async_"):
            if hasattr(module, name):
                setattr(module, name, labelled(f"hvd.{name}", getattr(module, name)))
    opt._DistributedOptimizer.synchronize = labelled("hvd.optimizer.synchronize",
                                                     opt._DistributedOptimizer.synchronize)
    from training.ports import hvd_port
    hvd_port._OneAllreduce.synchronize = labelled("hvd.one_allreduce", hvd_port._OneAllreduce.synchronize)
    hvd_port.apply()  # the ports' CUDA settings, before the init that reads them
    hvd.init()
    os.environ["HOROVOD_ELASTIC"] = "1"  # the optimizer's check alone (hooks_on.py says why)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("name")
    p.add_argument("script", choices=("main.py", "main_ddp.py", "main_horovod.py"))
    p.add_argument("--wait", type=int, default=25, help="untraced steps first (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--active", type=int, default=30, help="traced steps (default: %(default)s)")
    args, flags = p.parse_known_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.script == "main_horovod.py":
        label_horovod()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    base = os.path.join(args.out, args.name)

    def written(prof):
        prof.export_chrome_trace(base + ".trace.json.gz")
        raise StepsDone

    prof = torch.profiler.profile(
        activities=activities, record_shapes=False, with_stack=False, on_trace_ready=written,
        schedule=torch.profiler.schedule(wait=args.wait, warmup=args.warmup, active=args.active))
    step = utils.optimizer_step

    def traced_step(*a, **k):
        with torch.profiler.record_function("optimizer_step"):
            out = step(*a, **k)
        prof.step()
        return out
    utils.optimizer_step = traced_step
    trainer = importlib.import_module(args.script.removesuffix(".py"))
    prof.start()
    try:
        trainer.main(flags)
        done = False  # the run ended before the traced steps: too few steps for --wait + --active
    except StepsDone:
        done = True
    finally:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    from torch._dynamo.utils import counters
    with open(base + ".counters.json", "w") as f:
        json.dump({k: dict(v) for k, v in counters.items()}, f, indent=1, sort_keys=True)
    print(f"step_trace: {args.name}: " + (f"{args.active} steps traced in {base}.trace.json.gz" if done
                                          else "FAILED: the run ended before its traced steps"), flush=True)
    # The run stops mid-epoch: its launcher's peers and Horovod's threads are not waited for.
    sys.stdout.flush()
    os._exit(0 if done else 1)


if __name__ == "__main__":
    main()
