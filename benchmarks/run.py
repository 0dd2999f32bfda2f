"""Side-by-side benchmarks of the trainer, each figure a ratio measured in one run.

    .venv/bin/python -m benchmarks.run                 # full run (about 90 min on 2 idle CPU cores)
    .venv/bin/python -m benchmarks.run --quick         # smoke run (~1 min), for tests
    .venv/bin/python -m benchmarks.run --only loader_speedup,horovod_np1_overhead   # a subset
    .venv/bin/python -m benchmarks.run --only sweep_wall_time --merge   # re-measure one, keep the rest
    .venv/bin/python -m benchmarks.run --render        # measure nothing: rewrite the page from results.json

The full run writes benchmarks/results/results.json and benchmarks/results/RESULTS.md. --quick
writes into a fresh temporary folder unless --out is given, so a smoke run never replaces the
committed results. --only takes figure names; figures left out say so, or with --merge keep their
entries from the existing results.json, marked with the run that made them. A figure that raises
is reported (its traceback, then one line) and the run goes on; it is written as one not run
(with --merge, its earlier entry stays), and the run exits 1 naming it.

Each figure is one module of benchmarks/trainer/ (what the trainer does) or benchmarks/scaling/
(the scaling model and its emulator checked), named by its figure id (its NAME, its key in
results.json), with its goal and what it measures in its docstring and DESCRIPTION; FIGURES
below lists them in the order they run and are reported. Each is the median over interleaved
repeats, every repeat recorded.

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

--render judges the figures of --out's results.json again and rewrites its RESULTS.md and plots
(a figure module that adds points to a committed figure hands its page over to it).

This file only picks and runs figures; harness.py holds what they share (and the
interface of a figure module), trainer_runs.py the timed trainer runs. Figures import only the
modules below them (harness.py and its kind), never this one.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback

import torch

from benchmarks import harness
from benchmarks.gpu import results_section
from benchmarks.scaling import (
    emulator_vs_real_error,
    hierarchical_allreduce_error,
    horovod_compiled_over_ddp_cluster_100g,
    horovod_compiled_over_ddp_cluster_400g,
    probe_vs_emulator_error,
    scaling_model_heldout_error,
    tree_allreduce_error,
)
from benchmarks.trainer import (
    allreduce_overlap_np2,
    ddp_scaling_efficiency_np2,
    horovod_compiled_overlap_window_ratio,
    horovod_hook_overhead_ms,
    horovod_idle_threads_gain,
    horovod_np1_overhead,
    horovod_vs_ddp_np2,
    layout_design_cost,
    loader_speedup,
    mlflow_overhead_per_epoch,
    real_data_accuracy,
    scaling_efficiency_np2,
    search_best_acc_minus_grid,
    search_wall_time_vs_grid,
    sweep_wall_time,
    tracking_stall_hung_server,
)
from training.run import devices

# The registry: every figure, in the order they run and are reported. A new figure is a module of
# benchmarks/trainer/ or benchmarks/scaling/ named by its NAME, with harness.py's interface, and one entry here.
FIGURES = [loader_speedup, horovod_np1_overhead, horovod_hook_overhead_ms, scaling_efficiency_np2,
           ddp_scaling_efficiency_np2, horovod_vs_ddp_np2, horovod_idle_threads_gain, allreduce_overlap_np2,
           horovod_compiled_overlap_window_ratio, layout_design_cost, sweep_wall_time,
           search_wall_time_vs_grid, search_best_acc_minus_grid, mlflow_overhead_per_epoch, tracking_stall_hung_server,
           emulator_vs_real_error,
           scaling_model_heldout_error, probe_vs_emulator_error, hierarchical_allreduce_error,
           tree_allreduce_error, horovod_compiled_over_ddp_cluster_100g,
           horovod_compiled_over_ddp_cluster_400g, real_data_accuracy]


def parse_args(argv):
    names = ", ".join(m.NAME for m in FIGURES)
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
    p.add_argument("--render", action="store_true",
                   help="measure nothing: judge the figures of --out's results.json again and rewrite its "
                        "RESULTS.md and plots")
    args = p.parse_args(argv)
    if args.render and (args.quick or args.only or args.merge):
        p.error("--render measures nothing: it takes --out alone")
    by_name = {m.NAME: m for m in FIGURES}
    wanted = args.only.split(",") if args.only else [m.NAME for m in FIGURES]
    unknown = sorted(set(wanted) - set(by_name))
    if unknown:
        p.error(f"unknown --only figure(s): {', '.join(unknown)}; known: {names}")
    args.figures = [m for m in FIGURES if m in {by_name[w] for w in wanted}]
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.render:
        return render(args.out or harness.RESULTS)
    out = args.out or (tempfile.mkdtemp(prefix="bench-quick-") if args.quick else harness.RESULTS)
    os.makedirs(out, exist_ok=True)
    cfgs = {m.NAME: m.QUICK if args.quick else m.FULL for m in FIGURES}

    started = time.perf_counter()
    res = harness.start_results(argv, args.quick, {k: v for c in cfgs.values() for k, v in c.items()})
    device = devices.pick_device()  # what main.py would use; share_cores then sets its threads
    devices.share_cores(device)
    harness.log(f"device {device}, {torch.get_num_threads()} torch threads; writing to {out}")
    scratch = tempfile.mkdtemp(prefix="bench-")
    failed = {}
    try:
        ctx = harness.Context(device, scratch)
        for mod in args.figures:
            try:
                res["figures"][mod.NAME] = mod.run(cfgs[mod.NAME], ctx)
            except Exception as e:  # the other figures of the run are still measured and written
                traceback.print_exc()
                failed[mod.NAME] = f"{type(e).__name__}: {e}".splitlines()[0]
                harness.log(f"{mod.NAME} FAILED ({failed[mod.NAME]}); going on with the others")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    if args.merge:  # a figure that failed keeps its earlier entry, as one not run does
        harness.merge_earlier(res, os.path.join(out, "results.json"))
    for name, why in failed.items():
        res["figures"].setdefault(name, {"value": None, "skipped": f"failed: {why}"})
    res["failed"] = sorted(failed)
    harness.finish(res, FIGURES, out, started, tail=results_section.lines(out))
    harness.log(f"done in {res['duration_s']:.0f} s: {os.path.join(out, 'results.json')}, "
                f"{os.path.join(out, 'RESULTS.md')}")
    for name, f in res["figures"].items():
        print(f"{name:24s} {harness.fmt(f['value']):>8s}   goal {f['goal']:<7s} met {f['met']}")
    if failed:
        harness.log(f"{len(failed)} figure(s) failed: {', '.join(sorted(failed))} (tracebacks above)")
    return res


def render(out):
    """The record in out's results.json, judged again and written back with its RESULTS.md and plots."""
    path = os.path.join(out, "results.json")
    with open(path) as f:
        res = json.load(f)
    harness.rewrite(res, FIGURES, out, tail=results_section.lines(out))
    harness.log(f"rewrote {path} and {os.path.join(out, 'RESULTS.md')}")
    return res


if __name__ == "__main__":
    sys.exit(1 if main()["failed"] else 0)
