"""Figure real_data_accuracy: test accuracy on real CIFAR-10 after the same epochs, and the
training time it took, for every trainer.

Real CIFAR-10 comes from the JPEG pack beside the clone (../shared/data/make_cifar10.py; the
images are a JPEG copy of the originals, so accuracy can sit a little below what the original
files give). LeNet on the whole set, and MobileNet on a class-balanced subset (a model of its
size trains at a few hundred images/s on 2 CPU cores, so the whole set would take hours), run
the default recipe (batch 128, LR 0.1 cosine over the epochs) under main.py, main_horovod.py at
np=2, main_ddp.py at np=2, and main.py with pytorch-cifar's torchvision pipeline. Each run once:
the accuracy of a seeded run on the CPU is one number, not a distribution. Recorded per run:
the final test accuracy, the training time to reach a fixed accuracy (from metrics.csv's
train_time_s), and images/s. The headline is LeNet's accuracy under main.py; accuracy.png
beside RESULTS.md draws test accuracy against training time for every run.
"""
import os
import shutil
import subprocess
import sys

from benchmarks import harness, trainer_runs

NAME = "real_data_accuracy"
GOAL = (">=", 0.58)
DESCRIPTION = "LeNet's test accuracy on real CIFAR-10 (JPEG copy) after 10 epochs, main.py"
MAKER = os.path.join(os.path.dirname(harness.ROOT), "shared", "data", "make_cifar10.py")
# subset: (training, test) images of a class-balanced subset, or None for all 50,000 and 10,000.
FULL = dict(accuracy_models={"lenet": dict(epochs=10, threshold=0.5, subset=None),
                             "mobilenet": dict(epochs=2, threshold=0.3, subset=(10000, 2000))})
QUICK = dict(accuracy_models={"lenet": dict(epochs=1, threshold=0.2, subset=(1000, 200))})
SIDES = {  # name: (trainer_runs kind, extra flags)
    "main.py": ("main", []),
    "main_horovod.py np=2": ("hvd2", []),
    "main_ddp.py np=2": ("ddp2", []),
    "main.py, torchvision pipeline": ("main", ["--loader", "torchvision", "--workers", "2"]),
}
PLOT = "accuracy.png"


def real_data(scratch, subset):
    """The real set (or a subset) written once into the scratch folder; None where the pack is missing."""
    if not os.path.isfile(MAKER):
        return None
    folder = os.path.join(scratch, f"real-cifar10-{subset[0]}" if subset else "real-cifar10")
    if not os.path.isdir(os.path.join(folder, "cifar-10-batches-py")):
        size = ["--train", str(subset[0]), "--test", str(subset[1])] if subset else []
        subprocess.run([sys.executable, MAKER, folder, *size], check=True, capture_output=True)
    return folder


def command(kind, arch, epochs, data_dir, ckpt, flags):
    cmd = [sys.executable, "main_ddp.py" if kind.startswith("ddp") else
           "main_horovod.py" if kind.startswith("hvd") else "main.py",
           "--arch", arch, "--epochs", str(epochs), "--data-dir", data_dir, "--checkpoint-dir", ckpt,
           "--log-interval", "100000", *flags]
    if kind == "hvd2":
        return [os.path.join(os.path.dirname(sys.executable), "horovodrun"), "-np", "2", "--gloo", *cmd]
    if kind == "ddp2":
        return [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone",
                "--nproc_per_node", "2", *cmd[1:]]
    return cmd


def time_to(rows, threshold):
    """Training seconds until the first epoch whose test accuracy reached `threshold`, or None."""
    hit = next((r for r in rows if float(r["test_acc"]) >= threshold), None)
    return float(hit["train_time_s"]) if hit else None


def run(cfg, ctx):
    if not os.path.isfile(MAKER):
        return {"value": None, "skipped": f"real CIFAR-10 needs {os.path.normpath(MAKER)}"}
    models, n = {}, 0
    for arch, m in cfg["accuracy_models"].items():
        data_dir = ctx.shared(("real-cifar10", m["subset"]), lambda m=m: real_data(ctx.scratch, m["subset"]))
        models[arch] = {"epochs": m["epochs"], "threshold": m["threshold"], "runs": {},
                        "data": (f"a class-balanced subset of {m['subset'][0]} training and {m['subset'][1]} "
                                 "test images" if m["subset"] else "all 50,000 training and 10,000 test images")}
        for side, (kind, flags) in SIDES.items():
            n += 1
            ckpt = os.path.join(ctx.scratch, f"accuracy-{n:02d}")
            cmd = command(kind, arch, m["epochs"], data_dir, ckpt, flags)
            r, rows = trainer_runs.run_trainer(cmd, ckpt, timeout=3600)
            if r.returncode != 0:
                raise RuntimeError(f"{side} ({arch}) failed: {r.stderr.strip().splitlines()[-1:]}")
            shutil.rmtree(ckpt, ignore_errors=True)
            run_ = {"test_acc": float(rows[-1]["test_acc"]), "train_s": float(rows[-1]["train_time_s"]),
                    "time_to_threshold_s": time_to(rows, m["threshold"]),
                    "images_per_s": trainer_runs.images_per_s(rows),
                    "curve": [[float(r["train_time_s"]), float(r["test_acc"])] for r in rows],
                    "command": trainer_runs.shown(cmd, ctx.scratch)}
            models[arch]["runs"][side] = run_
            harness.log(f"accuracy {arch} {side}: test acc {run_['test_acc']:.4f} after {m['epochs']} epochs, "
                        f"{run_['train_s']:.0f} s of training, {run_['images_per_s']:.0f} img/s")
    value = models["lenet"]["runs"]["main.py"]["test_acc"]
    return {"value": value, "repeats": [value], "models": models, "plot": PLOT,
            "data": "real CIFAR-10, a JPEG copy (quality about 75) of the original images, in their "
                    "original order with their original labels"}


def plot(fig, path):
    """Test accuracy against training time, one line per run, one panel per model."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = fig["models"]
    figure, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.2), squeeze=False)
    for ax, (arch, m) in zip(axes[0], models.items()):
        for side, run_ in m["runs"].items():
            ax.plot(*zip(*run_["curve"]), marker=".", label=side)
        ax.set_title(f"{arch}, {m['epochs']} epochs, real CIFAR-10 (JPEG copy)", fontsize=10)
        ax.set_xlabel("training time (s)")
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)


def markdown(fig):
    L = [f"Data: {fig['data']}. Default recipe, each run once, seeded.", "",
         f"![test accuracy against training time]({fig['plot']})", ""]
    for arch, m in fig["models"].items():
        L += [f"{arch}, {m['epochs']} epochs, {m['data']}:", "",
              f"| run | test accuracy | training time (s) | time to {m['threshold']:g} (s) | images/s |",
              "|---|---|---|---|---|"]
        for side, r in m["runs"].items():
            reach = "not reached" if r["time_to_threshold_s"] is None else f"{r['time_to_threshold_s']:.1f}"
            L.append(f"| {side} | {r['test_acc']:.4f} | {r['train_s']:.1f} | {reach} | {r['images_per_s']:.0f} |")
        L.append("")
    L += ["Commands (LeNet):", ""]
    L += harness.command_lines({side: r["command"] for side, r in fig["models"]["lenet"]["runs"].items()})
    return L
