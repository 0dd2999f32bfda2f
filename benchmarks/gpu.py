"""GPU figures: the trainer's own images/s on a named GPU, written to benchmarks/results-gpu.json.

    make gpu-check                        # first: set-up against the machine's PyTorch, and a check
    .venv/bin/python -m benchmarks.gpu    # then this, in one call of under 10 minutes

Each figure is a real trainer run of ResNet-18 on 50,000 synthetic CIFAR-format images,
timed by the trainer itself (metrics.csv images/s of the last epoch; the first epoch holds
torch.compile's compiling). pytorch-cifar's pipeline (PIL transforms in 2 DataLoader
workers, fp32, contiguous) runs in the same call as the baseline, as the CPU benchmark runs
its loader. Absolute images/s mean something only on a GPU, so without one this exits at once.
Goals:

  main_bs128_bf16_img_s          main.py --amp bf16 --compile, batch 128          >= 35,000
  horovod_hooks_bs128_bf16_img_s the same in main_horovod.py at np=1 with the
                                 gradient hooks on (HOROVOD_ELASTIC=1)            >= 30,000
  main_bs512_bf16_img_s          batch 512, --lr 0.4                              >= 70,000
  speedup_vs_pytorch_cifar       main_bs128_bf16 over pytorch-cifar's pipeline    >= 5.5
  amp_over_fp32                  --amp bf16 over fp32, both --compile, batch 128  >= 1.0
  main_bs128_fp32_eager_img_s    main.py as by default (fp32, eager)              >= 12,100 (today's low)

With --accuracy-epochs N --real-data DIR it also trains ResNet-18 on real CIFAR-10 with --recipe fast and the speed
flags, first, to --target-acc 0.94 (or N epochs) and records the accuracy and the training time to it.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from benchmarks import harness, trainer_runs

IMAGES = 50000
BF16 = ["--amp", "--amp-dtype", "bfloat16"]
RUNS = {  # name: (script, flags, extra environment)
    "main_bs128_bf16": ("main.py", [*BF16, "--compile"], {}),
    "horovod_hooks_bs128_bf16": ("main_horovod.py", [*BF16, "--compile"], {"HOROVOD_ELASTIC": "1"}),
    "main_bs512_bf16": ("main.py", [*BF16, "--compile", "--batch-size", "512", "--lr", "0.4"], {}),
    "main_bs128_fp32": ("main.py", ["--compile"], {}),
    "main_bs128_fp32_eager": ("main.py", [], {}),
    "pytorch_cifar_pipeline": ("main.py", ["--loader", "torchvision", "--workers", "2", "--no-channels-last"], {}),
}
GOALS = {"main_bs128_bf16_img_s": 35000, "horovod_hooks_bs128_bf16_img_s": 30000,
         "main_bs512_bf16_img_s": 70000, "speedup_vs_pytorch_cifar": 5.5, "amp_over_fp32": 1.0,
         "main_bs128_fp32_eager_img_s": 12100}


def trainer_run(name, scratch, epochs):
    script, flags, extra = RUNS[name]
    ckpt = os.path.join(scratch, name)
    cmd = [sys.executable, script, "--arch", "resnet18", "--dataset", "synthetic", "--synthetic-size",
           str(IMAGES), "--data-dir", os.path.join(scratch, "data"), "--epochs", str(epochs),
           "--checkpoint-dir", ckpt, "--log-interval", "100000", *flags]
    if script == "main_horovod.py":
        cmd = [os.path.join(os.path.dirname(sys.executable), "horovodrun"), "-np", "1", "--gloo", *cmd]
    t0 = time.perf_counter()
    r, rows = trainer_runs.run_trainer(cmd, ckpt, extra, timeout=400)
    if r.returncode != 0:
        raise RuntimeError(f"{name} failed: {r.stderr.strip().splitlines()[-1:] or r.stdout[-500:]}")
    rate = float(rows[-1]["images_per_s"])
    harness.log(f"{name}: {rate:,.0f} img/s (epoch {len(rows)}; {time.perf_counter() - t0:.0f} s in all)")
    return {"images_per_s": rate, "epoch_time_s": [float(x["epoch_time_s"]) for x in rows],
            "command": trainer_runs.shown(cmd), "env": extra}


def accuracy_run(scratch, data_dir, epochs, target=0.94):
    """ResNet-18 on real CIFAR-10 with the speed flags, to `target` or `epochs`: the accuracy
    it reached, and the training time to the target (metrics.csv's train_time_s)."""
    ckpt = os.path.join(scratch, "accuracy")
    cmd = [sys.executable, "main.py", "--arch", "resnet18", "--recipe", "fast", "--data-dir", data_dir,
           "--epochs", str(epochs), "--target-acc", str(target), "--checkpoint-dir", ckpt,
           "--log-interval", "100000", *BF16, "--compile"]
    r, rows = trainer_runs.run_trainer(cmd, ckpt, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"accuracy run failed: {r.stderr.strip().splitlines()[-1:]}")
    hit = next((row for row in rows if float(row["test_acc"]) >= target), None)
    harness.log(f"accuracy: test acc {float(rows[-1]['test_acc']):.4f} after {len(rows)} epochs, "
                f"{float(rows[-1]['train_time_s']):.0f} s of training")
    return {"target": target, "reached": hit is not None, "epochs": len(rows),
            "test_acc": float(rows[-1]["test_acc"]), "best_test_acc": max(float(x["test_acc"]) for x in rows),
            "time_to_target_s": float(hit["train_time_s"]) if hit else None,
            "train_s": float(rows[-1]["train_time_s"]), "command": trainer_runs.shown(cmd),
            "data": "real CIFAR-10, a JPEG copy of the original images"}


def figures(runs):
    """Each goal's figure from the runs it needs; None where one of them was not run."""
    rate = {k: v["images_per_s"] for k, v in runs.items()}

    def ratio(a, b):
        return rate[a] / rate[b] if a in rate and b in rate else None
    return {
        "main_bs128_bf16_img_s": rate.get("main_bs128_bf16"),
        "horovod_hooks_bs128_bf16_img_s": rate.get("horovod_hooks_bs128_bf16"),
        "main_bs512_bf16_img_s": rate.get("main_bs512_bf16"),
        "speedup_vs_pytorch_cifar": ratio("main_bs128_bf16", "pytorch_cifar_pipeline"),
        "amp_over_fp32": ratio("main_bs128_bf16", "main_bs128_fp32"),
        "main_bs128_fp32_eager_img_s": rate.get("main_bs128_fp32_eager"),
    }


def write(path, device, started, runs, accuracy):
    figs = figures(runs)
    res = {"schema": harness.SCHEMA, "device": device, "machine": harness.machine_info(),
           "duration_s": time.perf_counter() - started,
           "figures": {k: {"value": v, "goal": f">= {GOALS[k]:g}", "met": None if v is None else v >= GOALS[k]}
                       for k, v in figs.items()},
           "runs": runs, "accuracy": accuracy}
    with open(path, "w") as f:
        json.dump(res, f, indent=2)
        f.write("\n")
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(harness.HERE, "results-gpu.json"))
    p.add_argument("--epochs", type=int, default=2, help="per run; the last one is timed (default: 2)")
    p.add_argument("--accuracy-epochs", type=int, default=0, metavar="N",
                   help="also train ResNet-18 on real CIFAR-10 (bf16, --compile) for up to N epochs with "
                        "--target-acc 0.94, and record the accuracy and the time to it (default: 0, off)")
    p.add_argument("--real-data", default=None, metavar="DIR",
                   help="the folder holding real cifar-10-batches-py, for --accuracy-epochs")
    p.add_argument("--only", action="append", choices=tuple(RUNS), default=None, metavar="RUN",
                   help=f"run only these (repeatable; default: all of {', '.join(RUNS)})")
    args = p.parse_args(argv)
    if args.accuracy_epochs and not args.real_data:
        p.error("--accuracy-epochs needs --real-data DIR (a folder holding real cifar-10-batches-py)")
    import torch
    if not torch.cuda.is_available():
        print("benchmarks.gpu: no CUDA GPU here; these figures are images/s on a named GPU, "
              "so run it on one (after make gpu-check)", file=sys.stderr)
        return 1
    started = time.perf_counter()
    device = torch.cuda.get_device_name()
    scratch = tempfile.mkdtemp(prefix="bench-gpu-")
    runs, accuracy = {}, None
    try:  # the results are written after each run, so a run cut short keeps the ones before it
        if args.accuracy_epochs:
            accuracy = accuracy_run(scratch, args.real_data, args.accuracy_epochs)
            write(args.out, device, started, runs, accuracy)
        for name in args.only or RUNS:
            runs[name] = trainer_run(name, scratch, args.epochs)
            write(args.out, device, started, runs, accuracy)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    res = write(args.out, device, started, runs, accuracy)
    harness.write_gpu_section(os.path.join(os.path.dirname(args.out), "RESULTS.md"), res)
    for k, f in res["figures"].items():
        shown = "not run" if f["value"] is None else f"{f['value']:>10,.1f}"
        print(f"{k:32s} {shown:>10s}   goal {f['goal']:<10s} met {f['met']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
