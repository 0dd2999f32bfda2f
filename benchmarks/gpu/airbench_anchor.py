"""airbench94, the time-to-accuracy anchor, trained on the same CIFAR-10 copy as the trainer.

    python -m benchmarks.gpu.airbench_anchor --sdist airbench-0.1.8.tar.gz --data DIR --runs 3 --out F

DIR holds cifar-10-batches-py (data.py reads it). airbench's loader reads cifar10/train.pt and
cifar10/test.pt under its working folder when they exist (uint8 N x 32 x 32 x 3 images, int64
labels), so they are written there from the same arrays and it never downloads. The sdist is
pure Python: it is unpacked and imported from there. After airbench.warmup94(), train94() runs
`runs` times at tta_level=2 (its default: mirror and translate at test time) and `runs` times at
tta_level=0; every trained network is evaluated at both levels. `train_s` is the wall time of a
train94() call (the GPU synchronised before and after), which holds its loading of the data
and building of the network: a little more than airbench's own printed figure. Needs CUDA.
"""
import argparse
import json
import os
import statistics
import sys
import tarfile
import tempfile
import time

import torch

from training.run import data


def write_airbench_data(data_dir, work):
    """cifar10/{train,test}.pt under `work` from DIR's cifar-10-batches-py."""
    (train_x, train_y), (test_x, test_y) = data.read_cifar10(os.path.join(data_dir, "cifar-10-batches-py"))
    os.makedirs(os.path.join(work, "cifar10"), exist_ok=True)
    for name, x, y in (("train", train_x, train_y), ("test", test_x, test_y)):
        torch.save({"images": x.permute(0, 2, 3, 1).contiguous(), "labels": y.long(),
                    "classes": list(data.CLASSES)}, os.path.join(work, "cifar10", f"{name}.pt"))


def import_airbench(sdist, work):
    with tarfile.open(sdist) as tar:
        tar.extractall(work, filter="data")
    folder = next(os.path.join(work, d) for d in os.listdir(work) if d.startswith("airbench-"))
    sys.path.insert(0, folder)
    import airbench
    return airbench


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sdist", required=True)
    p.add_argument("--data", required=True, help="the folder holding cifar-10-batches-py")
    p.add_argument("--runs", type=int, default=3, help="runs at each TTA level (default: 3)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("airbench_anchor: airbench trains on CUDA only; run it on a GPU", file=sys.stderr)
        return 1
    work = tempfile.mkdtemp(prefix="airbench-")
    write_airbench_data(args.data, work)
    airbench = import_airbench(args.sdist, work)
    os.chdir(work)  # airbench reads ./cifar10
    airbench.warmup94(verbose=False)
    test_loader = airbench.CifarLoader("cifar10", train=False, batch_size=2000)
    runs = []
    for level in [2] * args.runs + [0] * args.runs:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model = airbench.train94(tta_level=level, verbose=False)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        run = {"tta_level": level, "train_s": seconds,
               "acc_tta0": airbench.evaluate(model, test_loader, tta_level=0),
               "acc_tta2": airbench.evaluate(model, test_loader, tta_level=2)}
        runs.append(run)
        print(f"airbench94: tta_level={level} acc {run['acc_tta0']:.4f} (tta0) {run['acc_tta2']:.4f} "
              f"(tta2) in {seconds:.2f} s", flush=True)
        with open(args.out, "w") as f:  # after every run, so a run cut short keeps the ones before
            json.dump(summary(runs, args.sdist), f, indent=2)
    return 0


def summary(runs, sdist):
    return {"version": os.path.basename(sdist).removesuffix(".tar.gz"),
            "tta2_mean_acc": statistics.fmean(r["acc_tta2"] for r in runs),
            "tta0_mean_acc": statistics.fmean(r["acc_tta0"] for r in runs),
            "train_s": statistics.median(r["train_s"] for r in runs),
            "runs": runs,
            "note": "every run's network evaluated at both TTA levels; train_s is the median "
                    "wall time of a train94() call, its data loading and network building included"}


if __name__ == "__main__":
    sys.exit(main())
