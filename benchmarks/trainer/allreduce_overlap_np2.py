"""Figure allreduce_overlap_np2: how much of the gradient allreduce the backward pass hides, at
np=2 on the CPU, for both ports, eager and under --compile.

Each side is one run of benchmarks/diagnostics/overlap.py (the trainer itself, with timing
probes): ResNet-18 at batch 16, whose 62 gradient tensors (44.7 MB) and long backward give the
allreduce room to overlap, two processes on the two cores, one thread each. Per step, after the
first steps (compiling): `window_ms`, from the first gradient ready to the last (the time in
which a reduction can run beside the backward at all), the exposed reduction after the last
gradient, and the same gradients' reduction timed alone; the overlap is 1 - exposed / alone.
The headline is Horovod's overlap under --compile with the model compiled whole and its hooks
(--grad-allreduce hooks), the case that a compiled backward threatens: its hooks see every
gradient only when the whole compiled backward has run (horovod_compiled_overlap_window_ratio
measures the stage-by-stage compile that replaces it across hosts). DDP's wrapper is
compiled with its buckets split apart (DDPOptimizer), so its gradients still come bucket by
bucket. On 2 CPU cores the ranks' compute and the allreduce share the cores, so an overlap here
is lower than where the GPU computes and the host and network reduce; the window is the
structural part, and carries to GPUs.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks import harness, trainer_runs

NAME = "allreduce_overlap_np2"
GOAL = (">=", 0.5)
DESCRIPTION = "share of the allreduce hidden by the backward at np=2, Horovod under --compile (ResNet-18)"
SIDES = {  # name: (script, launcher, flags)
    "Horovod, eager": ("main_horovod.py", "horovodrun", []),
    "Horovod, --compile": ("main_horovod.py", "horovodrun", ["--compile", "--grad-allreduce", "hooks"]),
    "DDP, eager": ("main_ddp.py", "torchrun", []),
    "DDP, --compile": ("main_ddp.py", "torchrun", ["--compile"]),
}
FULL = dict(arch="resnet18", train_size=640, train_batch=16, train_epochs=2, overlap_repeats=2)
QUICK = dict(arch="lenet", train_size=250, train_batch=32, train_epochs=2, overlap_repeats=1)


def side(cfg, data_dir, scratch, name, n, sides=SIDES):
    script, launcher, flags = sides[name]
    ckpt = tempfile.mkdtemp(prefix=f"overlap-{n}-", dir=scratch)  # a folder of its own, in any figure
    probe = ["-m", "benchmarks.diagnostics.overlap", script, "--data-dir", data_dir, "--dataset", "synthetic",
             "--synthetic-size", str(cfg["train_size"]), "--arch", cfg["arch"], "--batch-size",
             str(cfg["train_batch"]), "--epochs", str(cfg["train_epochs"]), "--lr", "0.05", "--warmup-epochs", "0",
             "--log-interval", "100000", "--checkpoint-dir", ckpt, *flags]
    bin_ = os.path.dirname(sys.executable)
    if launcher == "horovodrun":
        cmd = [os.path.join(bin_, "horovodrun"), "-np", "2", "--gloo", sys.executable, *probe]
    else:
        cmd = [os.path.join(bin_, "torchrun"), "--standalone", "--nproc_per_node", "2", *probe]
    r = subprocess.run(cmd, cwd=harness.ROOT, env=trainer_runs.env(), capture_output=True, text=True,
                       timeout=1800, stdin=subprocess.DEVNULL)
    lines = [ln[ln.index("{"):] for ln in r.stdout.splitlines() if '"exposed_ms"' in ln]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"{name} failed ({r.returncode}): {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    out = json.loads(lines[-1])
    out["command"] = trainer_runs.shown(cmd, scratch)
    return out


def sides_run(cfg, ctx, sides):
    """Every side of `sides` (name: (script, launcher, flags)) run cfg["overlap_repeats"] times,
    alternating: {name: [each run's overlap.py figures]}."""
    runs = trainer_runs.shared(dict(trainer_runs.QUICK, **cfg), ctx)  # the data, generated once
    got = {s: [] for s in sides}
    n = 0
    for r, order in enumerate(harness.alternating(list(sides), cfg["overlap_repeats"])):
        for name in order:
            n += 1
            got[name].append(side(cfg, runs.data_dir, ctx.scratch, name, n, sides))
        harness.log(f"overlap repeat {r + 1}/{cfg['overlap_repeats']}: " + ", ".join(
            f"{s} {got[s][-1]['overlap']:.2f} (window {got[s][-1]['spread_ms']:.0f} ms of "
            f"{got[s][-1]['compute_ms']:.0f})" for s in sides))
    return got


def run(cfg, ctx):
    got = sides_run(cfg, ctx, SIDES)

    def med(name, key):
        return statistics.median(x[key] for x in got[name])
    sides = {name: {"overlap": med(name, "overlap"), "window_ms": med(name, "spread_ms"),
                    "compute_ms": med(name, "compute_ms"), "exposed_ms": med(name, "exposed_ms"),
                    "alone_ms": med(name, "alone_ms"),
                    "window_share": med(name, "spread_ms") / med(name, "compute_ms"),
                    "repeats": [x["overlap"] for x in got[name]]} for name in SIDES}
    return {"value": sides["Horovod, --compile"]["overlap"], "repeats": sides["Horovod, --compile"]["repeats"],
            "sides": sides, "setup": setup(cfg, got)}


def setup(cfg, got):
    """The model's settings and each side's last command, as this figure and the window ratio keep them."""
    return {"model": {k: cfg[k] for k in ("arch", "train_size", "train_batch", "train_epochs")},
            "commands": {name: runs[-1]["command"] for name, runs in got.items()}}


def model_line(fig):
    """How a run-of-sides figure's section begins: the model and data of every side."""
    st = fig["setup"]["model"]
    return (f"{st['arch']}, batch {st['train_batch']}, {st['train_size']} images, {st['train_epochs']} epochs at "
            "np=2 (one thread a rank)")


def markdown(fig):
    L = [model_line(fig) + "; medians over the steps after the first five, then over the repeats. The "
         "window is the share of the backward in which gradients are ready to be reduced; the overlap, the "
         "share of the reduction (timed alone) that the backward hid.", "",
         "| side | window (share of the backward) | backward, ms | exposed reduction, ms | reduction alone, ms "
         "| overlap |", "|---|---|---|---|---|---|"]
    for name, s in fig["sides"].items():
        L.append(f"| {name} | {s['window_ms']:.0f} ms ({s['window_share']:.2f}) | {s['compute_ms']:.0f} | "
                 f"{s['exposed_ms']:.0f} | {s['alone_ms']:.0f} | {s['overlap']:.2f} |")
    L.append("")
    L += harness.command_lines(fig["setup"]["commands"])
    return L
