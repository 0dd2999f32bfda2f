"""Horovod's knobs at np=2 on this machine: each setting against the defaults, alternating.

    .venv/bin/python -m benchmarks.horovod_knobs                 # LeNet, 3 repeats
    .venv/bin/python -m benchmarks.horovod_knobs --arch mobilenet --batch 16 --size 640 --epochs 3

Each setting runs `horovodrun -np 2` (gloo unless it says MPI) with trainer_runs' flags,
alternating with the defaults (A B, B A, ...), and prints images/s per repeat and the
median ratio to the defaults; DDP (torchrun) runs alongside as the yardstick. The
findings are in docs/PERFORMANCE.md. Not a figure: run.py does not list it.
"""
import argparse
import os
import tempfile

from benchmarks import harness, trainer_runs

# name: (trainer_runs kind, extra environment)
SETTINGS = {
    "defaults": ("hvd2", {}),
    "cycle 5 ms": ("hvd2", {"HOROVOD_CYCLE_TIME": "5"}),
    "cycle 10 ms": ("hvd2", {"HOROVOD_CYCLE_TIME": "10"}),
    "cycle 0.2 ms": ("hvd2", {"HOROVOD_CYCLE_TIME": "0.2"}),
    "no fusion": ("hvd2", {"HOROVOD_FUSION_THRESHOLD": "0"}),
    "fusion 4 MB": ("hvd2", {"HOROVOD_FUSION_THRESHOLD": str(4 << 20)}),
    "thread affinity": ("hvd2", {"HOROVOD_THREAD_AFFINITY": "0,1"}),
    "MPI controller": ("hvd2-mpi", {}),
    "DDP (torchrun)": ("ddp2", {}),
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="lenet")
    p.add_argument("--batch", type=int, default=trainer_runs.FULL["train_batch"])
    p.add_argument("--size", type=int, default=trainer_runs.FULL["train_size"])
    p.add_argument("--epochs", type=int, default=trainer_runs.FULL["train_epochs"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", default=None, help="comma-separated setting names (default: all)")
    args = p.parse_args()
    names = args.only.split(",") if args.only else [n for n in SETTINGS if n != "defaults"]
    cfg = dict(trainer_runs.FULL, arch=args.arch, train_batch=args.batch, train_size=args.size,
               train_epochs=args.epochs)
    runs = trainer_runs.TrainerRuns(cfg, tempfile.mkdtemp(prefix="knobs-"))
    harness.log(f"{args.arch} batch {args.batch}, {args.size} images, {args.epochs} epochs; "
                f"load {os.getloadavg()[0]:.2f}")
    for name in names:
        kind, extra = SETTINGS[name]
        ratios, seen = [], {"defaults": [], name: []}
        for order in harness.alternating(["defaults", name], args.repeats):
            got = {}
            for side in order:
                k, e = SETTINGS[side]
                got[side] = runs.run(k, env_extra=e)["images_per_s"]
                seen[side].append(got[side])
            ratios.append(got[name] / got["defaults"])
        harness.log(f"{name} ({kind} {extra}): {', '.join(f'{x:.0f}' for x in seen[name])} img/s against "
                    f"defaults {', '.join(f'{x:.0f}' for x in seen['defaults'])}; median ratio "
                    f"{harness.median(ratios):.3f} ({', '.join(f'{r:.3f}' for r in ratios)}); "
                    f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
