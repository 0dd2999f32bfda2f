"""Side-by-side benchmarks of the trainer, each figure a ratio measured in one run.

    .venv/bin/python -m benchmarks.run                 # full run (about 90 min on 2 idle CPU cores)
    .venv/bin/python -m benchmarks.run --quick         # smoke run (~1 min), for tests
    .venv/bin/python -m benchmarks.run --only loader_speedup,overhead   # a subset
    .venv/bin/python -m benchmarks.run --only sweep --merge   # re-measure one, keep the rest

The full run writes benchmarks/results.json and benchmarks/RESULTS.md. --quick
writes into a fresh temporary folder unless --out is given, so a smoke run
never replaces the committed results. --only takes figure names, or the short
name of a figure's module (fig_loader.py: loader); figures left out say so, or with
--merge keep their entries from the existing results.json, marked with the run that made them.

Figures (each the median over interleaved repeats; every repeat is recorded):

  loader_speedup          images/s of loaders.DeviceLoader over the torchvision PIL
                          pipeline (2 workers), same images, full epochs   goal >= 20
                          (fig_loader.py)
  horovod_np1_overhead    training time of main_horovod.py at np=1 over main.py,
                          same flags, sum of metrics.csv epoch_time_s      goal <= 1.02
                          (fig_overhead.py)
  scaling_efficiency_np2  images/s of horovodrun -np 2 --gloo over 2 x the
                          images/s of one process with the same threads    goal >= 0.90
                          (fig_scaling.py)
  ddp_scaling_efficiency_np2  the same for torchrun -np 2 main_ddp.py    goal >= 0.90
                          (fig_ddp_scaling.py)
  horovod_vs_ddp_np2      images/s of horovodrun -np 2 over torchrun
                          --nproc_per_node 2, same work (MobileNet; LeNet
                          beside), and the allreduce per step of both     goal >= 0.95
                          (fig_ddp.py)
  horovod_idle_threads_gain  Horovod np=2 images/s with its threads in the
                          cores' spare time over normal priority (MobileNet;
                          LeNet beside), and the other levers on its per-step
                          cost against the defaults, DDP beside them      goal >= 1.05
                          (fig_levers.py)
  layout_design_cost      step time of channels_last weights with
                          layout.GradLayout over contiguous weights with
                          channels_last input, gradient hooks on           goal <= 1.02
                          (fig_layout.py)
  sweep_wall_time         wall time of two runs as one --sweep job at np=2
                          (a process per run) over the same two runs one
                          after the other at np=2; beside it four runs
                          queued on two groups over the four in turn      goal <= 0.9
                          (fig_sweep.py)
  scaling_model_heldout_error  the scaling model's largest relative error of
                          the step time on runs across 2-4 namespace hosts
                          with shaped links that it was not fitted to;
                          beside it predictions for GPU clusters (needs
                          root; about 40 minutes)                          goal <= 0.2
                          (fig_hosts.py)
  real_data_accuracy      LeNet's test accuracy on real CIFAR-10 after 10
                          epochs under main.py; beside it every trainer,
                          the torchvision pipeline and a second model:
                          accuracy, time to a fixed accuracy, images/s,
                          and accuracy.png                                goal >= 0.58
                          (fig_accuracy.py)

Side A and side B of a figure alternate (ABBA...), so slow drift of a shared,
noisy machine falls on both. The headline of a figure is the median of the
per-repeat ratios (each ratio from two adjacent measurements); the ratio of the
two sides' medians is recorded beside it, and a figure whose repeats fall on
both sides of its goal is marked inconclusive, as is one with AGREE whose repeats spread
wider than that ((max - min) / median).

On the CPU two variants are recorded beside the headlines: the DeviceLoader also
on the trainer's thread count (the headline uses 1 thread, the smaller share
against 2 PIL workers), and the np=1 overhead pair also with both processes
confined to one core.

This file only picks and runs figures; harness.py holds what they share (and the
interface of a figure module), trainer_runs.py the timed trainer runs.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

import torch

from benchmarks import (
    fig_accuracy,
    fig_ddp,
    fig_ddp_scaling,
    fig_hosts,
    fig_layout,
    fig_levers,
    fig_loader,
    fig_overhead,
    fig_scaling,
    fig_sweep,
    harness,
)
from training import devices

# The registry: every figure, in the order they run and are reported. A new figure
# is a fig_*.py module with harness.py's interface, and one entry here.
FIGURES = [fig_loader, fig_overhead, fig_scaling, fig_ddp_scaling, fig_ddp, fig_levers, fig_layout, fig_sweep,
           fig_hosts, fig_accuracy]


def short_name(mod):
    return mod.__name__.rsplit(".", 1)[-1].removeprefix("fig_")


def parse_args(argv):
    names = ", ".join(f"{m.NAME} ({short_name(m)})" for m in FIGURES)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run with tiny sizes and one repeat (~1 min)")
    p.add_argument("--out", default=None,
                   help="folder for results.json and RESULTS.md (default: benchmarks/, "
                        "or a new temporary folder under --quick)")
    p.add_argument("--only", default=None, metavar="NAME[,NAME]",
                   help=f"comma-separated subset of: {names} (default: all)")
    p.add_argument("--merge", action="store_true",
                   help="keep the figures not run from the existing results.json in --out, each marked "
                        "with the date, commit and command of the run that measured it")
    args = p.parse_args(argv)
    by_name = {key: m for m in FIGURES for key in (m.NAME, short_name(m))}
    wanted = args.only.split(",") if args.only else [m.NAME for m in FIGURES]
    unknown = sorted(set(wanted) - set(by_name))
    if unknown:
        p.error(f"unknown --only figure(s): {', '.join(unknown)}; known: {names}")
    args.figures = [m for m in FIGURES if m in {by_name[w] for w in wanted}]
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out = args.out or (tempfile.mkdtemp(prefix="bench-quick-") if args.quick else harness.HERE)
    os.makedirs(out, exist_ok=True)
    cfgs = {m.NAME: m.QUICK if args.quick else m.FULL for m in FIGURES}

    started = time.perf_counter()
    res = harness.start_results(argv, args.quick, {k: v for c in cfgs.values() for k, v in c.items()})
    device = devices.pick_device()  # what main.py would use (CPU: all usable cores as threads)
    devices.share_cores(device)
    harness.log(f"device {device}, {torch.get_num_threads()} torch threads; writing to {out}")
    scratch = tempfile.mkdtemp(prefix="bench-")
    try:
        ctx = harness.Context(device, scratch)
        for mod in args.figures:
            res["figures"][mod.NAME] = mod.run(cfgs[mod.NAME], ctx)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    if args.merge:
        harness.merge_earlier(res, os.path.join(out, "results.json"))
    harness.finish(res, FIGURES, out, started)
    harness.log(f"done in {res['duration_s']:.0f} s: {os.path.join(out, 'results.json')}, "
                f"{os.path.join(out, 'RESULTS.md')}")
    for name, f in res["figures"].items():
        print(f"{name:24s} {harness.fmt(f['value']):>8s}   goal {f['goal']:<7s} met {f['met']}")
    return res


if __name__ == "__main__":
    main()
