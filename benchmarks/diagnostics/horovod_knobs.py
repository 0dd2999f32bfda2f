"""Horovod's levers at np=2 on this machine, any of them, against the defaults and DDP.

    .venv/bin/python -m benchmarks.diagnostics.horovod_knobs                          # LeNet, every setting
    .venv/bin/python -m benchmarks.diagnostics.horovod_knobs --arch mobilenet --batch 16 --size 1600 --epochs 3 \\
        --only "normal priority,groups 1"

The settings are benchmarks/trainer/horovod_idle_threads_gain.py's (that figure runs a few of
them in every full benchmark run). Each repeat runs the defaults and every chosen setting once, in an
order reversed every other repeat, and prints images/s per repeat, the median, and the median
ratio to the defaults. The findings are in docs/PERFORMANCE.md. Not a figure: run.py does not
list it.
"""
import argparse
import os
import tempfile

from benchmarks import harness, trainer_runs
from benchmarks.trainer import horovod_idle_threads_gain


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="lenet")
    p.add_argument("--batch", type=int, default=trainer_runs.FULL["train_batch"])
    p.add_argument("--size", type=int, default=trainer_runs.FULL["train_size"])
    p.add_argument("--epochs", type=int, default=trainer_runs.FULL["train_epochs"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", default=None, help="comma-separated setting names (default: all): "
                   + ", ".join(horovod_idle_threads_gain.SETTINGS))
    args = p.parse_args()
    names = args.only.split(",") if args.only else [n for n in horovod_idle_threads_gain.SETTINGS if n != "defaults"]
    unknown = set(names) - set(horovod_idle_threads_gain.SETTINGS)
    if unknown:
        p.error(f"unknown settings: {', '.join(sorted(unknown))}")
    cfg = dict(trainer_runs.FULL, arch=args.arch, train_batch=args.batch, train_size=args.size,
               train_epochs=args.epochs)
    runs = trainer_runs.TrainerRuns(cfg, tempfile.mkdtemp(prefix="knobs-"))
    harness.log(f"{args.arch} batch {args.batch}, {args.size} images, {args.epochs} epochs; "
                f"load {os.getloadavg()[0]:.2f}")
    got, _ = horovod_idle_threads_gain.measure(runs, ["defaults", *names], args.repeats, args.arch)
    for side, row in horovod_idle_threads_gain.table(got).items():
        harness.log(f"{side}: {', '.join(f'{x:.0f}' for x in row['images_per_s'])} img/s, median "
                    f"{row['median']:.1f}, over the defaults {row['vs_defaults']:.3f}")


if __name__ == "__main__":
    main()
