"""Figure horovod_compiled_overlap_window_ratio: under --compile, how much of the backward the
Horovod port's gradients arrive over, against eager, at np=2 on the CPU.

A reduction can run beside the backward only between the first gradient ready and the last
(the window, benchmarks/diagnostics/overlap.py). Eager, the hooks see each gradient as backward
makes it, so the window is nearly the whole backward. With the model compiled whole, autograd
accumulates every gradient when the one compiled backward ends: the window is about 0, and
nothing overlaps across hosts. With the model compiled block by block (--grad-allreduce regions,
what --compile across hosts runs: training/ports/hvd_port.py), each block's gradients come when its own
backward ends. The value is the regions side's window over the eager side's, each the median
over the steps after the first five, then over the repeats; the sides alternate (ABC, CBA).
The whole-model side is the path the regions replace, for comparison. The windows are structure
(when gradients become ready), and carry to GPUs; what of the reduction the backward hides on 2
shared CPU cores is allreduce_overlap_np2's.
"""
import statistics

from benchmarks import harness
from benchmarks.trainer import allreduce_overlap_np2 as overlap

NAME = "horovod_compiled_overlap_window_ratio"
GOAL = (">=", 0.8)
DESCRIPTION = "Horovod's gradient window under --compile (by regions) over eager's, np=2 (ResNet-18)"
SIDES = {  # name: (script, launcher, flags)
    "eager": ("main_horovod.py", "horovodrun", []),
    "--compile, whole model": ("main_horovod.py", "horovodrun", ["--compile", "--grad-allreduce", "hooks"]),
    "--compile, regions": ("main_horovod.py", "horovodrun", ["--compile", "--grad-allreduce", "regions"]),
}
FULL = dict(overlap.FULL)
QUICK = dict(overlap.QUICK)


def run(cfg, ctx):
    got = overlap.sides_run(cfg, ctx, SIDES)
    sides = {name: {"window_ms": statistics.median(x["spread_ms"] for x in got[name]),
                    "backward_ms": statistics.median(x["compute_ms"] for x in got[name]),
                    "windows": [x["spread_ms"] for x in got[name]]} for name in SIDES}
    ratios = [c["spread_ms"] / e["spread_ms"] for c, e in zip(got["--compile, regions"], got["eager"])]
    return {"value": sides["--compile, regions"]["window_ms"] / sides["eager"]["window_ms"],
            "repeats": ratios, "sides": sides, "setup": overlap.setup(cfg, got)}


def markdown(fig):
    L = [overlap.model_line(fig) + ". The window runs from the first gradient ready to the last: the part of "
         "the backward beside which an allreduce can run at all.", "",
         "| side | window, ms | backward, ms | share of the backward |", "|---|---|---|---|"]
    for name, s in fig["sides"].items():
        L.append(f"| {name} | {s['window_ms']:.0f} | {s['backward_ms']:.0f} | "
                 f"{s['window_ms'] / s['backward_ms']:.2f} |")
    L.append("")
    L += harness.command_lines(fig["setup"]["commands"])
    return L
