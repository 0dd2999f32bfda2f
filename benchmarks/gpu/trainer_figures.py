"""The trainer's GPU figures (commands.sh trainer): accuracy and speed on a named GPU beside the
anchors, written to benchmarks/results/results-gpu.json.

    python3 -m benchmarks.gpu.trainer_figures --data DIR --out FILE   # the GPU machine's PyTorch
    python3 -m scripts.gpu_check --no-setup --merge FILE             # the ports (needs Horovod)

bash benchmarks/gpu/commands.sh trainer, then ports, runs both. DIR holds real CIFAR-10: cifar-10-batches-py (as
`python main.py --download` leaves it in ./data, the default), or a pack of it with its writer
make_cifar10.py, which writes that layout. airbench's sdist comes from --airbench, else from PyPI.
In order, each writing FILE as it ends, so that a command stopped at its limit keeps what it
measured:

  data       real CIFAR-10 from DIR, in the layout main.py reads
  anchors    airbench94 on the same copy (benchmarks/gpu/airbench_anchor.py): its mean accuracy
             without test-time augmentation (tta0) and with it (tta2), and its time
  accuracy   main.py --recipe fast, bf16, --compile: its metrics.csv, its accuracy without TTA
             against airbench's tta0 mean and, evaluated again with --tta, against tta2
  time       the time to airbench's tta0 mean, compiling included, on shorter schedules: with
             torch.compile's on-disk caches cold, then warm, and without compiling (TIME_RUNS)
  syncs      host syncs per epoch of the bs128 bf16 compiled run, and where they are raised
  speed      main.py's images/s, ResNet-18 on 50,000 synthetic images, 2 epochs each (the
             second timed; the first holds torch.compile's compiling), and pytorch-cifar's
             pipeline (PIL transforms in 2 DataLoader workers, fp32) as the baseline
  ablation   the fast recipe's changes one at a time, shorter runs side by side on the GPU

Phases that would not fit in --budget seconds are skipped and say so. Without CUDA it exits
at once: these are absolute figures of a named GPU. `--cpu-smoke` runs the same phases on the
CPU, small (LeNet, a subset, few epochs; airbench and the sync count need CUDA and are left
out), to try the command before spending GPU time on it.
"""
import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks import harness, trainer_runs

IMAGES = 50000
# --cpu-smoke: LeNet on a subset, and in place of airbench's accuracy (it needs CUDA) a target any
# run reaches, so that every phase's path runs.
SMOKE = {"arch": "lenet", "images": 1000, "epochs": "2", "subset": ["--train", "2000", "--test", "500"],
         "target": 0.05}
ARCH = {"arch": "resnet18"}  # --cpu-smoke: SMOKE's
BF16 = ["--amp", "--amp-dtype", "bfloat16"]
RUNS = {  # name: (script, flags, extra environment, synthetic images)
    "main_bs128_bf16": ("main.py", [*BF16, "--compile"], {}, IMAGES),
    "main_bs512_bf16": ("main.py", [*BF16, "--compile", "--batch-size", "512", "--lr", "0.4"], {}, IMAGES),
    "main_bs128_fp32": ("main.py", ["--compile"], {}, IMAGES),
    "main_bs128_fp32_eager": ("main.py", [], {}, IMAGES),
    "main_bs128_fp32_eager_10k": ("main.py", [], {}, 10000),
    "main_bs128_bf16_eager": ("main.py", BF16, {}, IMAGES),
    "pytorch_cifar_pipeline": ("main.py", ["--loader", "torchvision", "--workers", "2", "--no-channels-last"],
                               {}, IMAGES),
}
# The fast recipe reached from the one before it, one change at a time (--epochs ABLATION_EPOCHS).
ABLATION_EPOCHS = 15
ABLATION = {
    "before: cosine per epoch, lr 0.2, smoothing 0.1": ["--lr", "0.2", "--lr-schedule", "cosine",
                                                        "--no-nesterov", "--label-smoothing", "0.1",
                                                        "--cutout", "0"],
    "+ one-cycle per step, lr 0.4": ["--lr-schedule", "onecycle", "--no-nesterov", "--label-smoothing",
                                     "0.1", "--cutout", "0"],
    "+ Nesterov, smoothing 0.2": ["--cutout", "0"],
    "+ cutout 8 (the fast recipe)": [],
}
GOALS = {"main_bs128_bf16_img_s": (">=", 35000), "main_bs512_bf16_img_s": (">=", 70000),
         "speedup_vs_pytorch_cifar": None, "bf16_over_fp32_compiled": (">=", 1.0),
         "bf16_over_fp32_eager": None, "accuracy_minus_airbench_tta0": (">=", 0.0),
         "tta_accuracy_minus_airbench_tta2": (">=", 0.0), "accuracy_train_s": ("<=", 300),
         "time_to_airbench94_tta0_cold_s": ("<=", 20), "time_to_airbench94_tta0_warm_s": ("<=", 20),
         "horovod_hooks_over_main_bs128_bf16": (">=", 0.9), "horovod_hooks_over_main_bs512_bf16": (">=", 0.9),
         "ddp_over_main_bs128_bf16": (">=", 0.9), "ddp_over_main_bs512_bf16": (">=", 0.9),
         "horovod_per_tensor_hooks_over_main_bs128_bf16": None, "horovod_regions_over_main_bs128_bf16": None,
         "horovod_per_tensor_hooks_over_main_bs512_bf16": None, "horovod_regions_over_main_bs512_bf16": None}
# Figures reported without a goal, and why their goals were retired.
RETIRED = {
    "speedup_vs_pytorch_cifar": "pytorch-cifar's pipeline is CPU-bound (PIL in 2 DataLoader workers): it ran at "
                                "5.0k, 6.3k and 12.7k img/s on three hosts with the same GPU, so the ratio "
                                "measures the host's CPU, not this trainer",
    "bf16_over_fp32_eager": "eager batch 128 is launch-bound (the GPU waits on Python and kernel launches), and "
                            "autocast adds a cast kernel per weight in forward and per gradient in backward; "
                            "compiled, bf16 is 1.66x fp32",
}
# Time to airbench94's tta0 accuracy on the same copy, counting compilation (metrics.csv's
# train_time_s at the first epoch that reaches it): the fast recipe on shorter schedules, with
# torch.compile's on-disk caches (Inductor's and Triton's) empty, then warm from the run before.
TIME_EPOCHS = (20, 24)
TIME_RUNS = {  # name: (epochs, compiled, the cache state)
    f"compiled, {TIME_EPOCHS[0]} epochs, cold compile cache": (TIME_EPOCHS[0], True, "cold"),
    f"compiled, {TIME_EPOCHS[0]} epochs, warm compile cache": (TIME_EPOCHS[0], True, "warm"),
    f"compiled, {TIME_EPOCHS[1]} epochs, warm compile cache": (TIME_EPOCHS[1], True, "warm"),
    f"eager, {TIME_EPOCHS[0]} epochs": (TIME_EPOCHS[0], False, "none"),
}
# Rough seconds each phase takes on an H100, to skip what would not fit.
COST = {"data": 40, "anchors": 60, "accuracy": 120, "time": 150, "speed": 25, "syncs": 35, "ablation": 90}


class Budget:
    def __init__(self, seconds):
        self.end = time.perf_counter() + seconds

    def allows(self, phase, cost=None):
        left = self.end - time.perf_counter()
        if left >= (cost or COST[phase]):
            return True
        harness.log(f"{phase}: skipped, {left:.0f} s of the budget left")
        return False


def python():
    return sys.executable


def trainer_run(name, scratch, epochs=2):
    script, flags, extra, images = RUNS[name]
    images = min(images, ARCH.get("images", images))
    ckpt = os.path.join(scratch, name)
    cmd = [python(), script, "--arch", ARCH["arch"], "--dataset", "synthetic", "--synthetic-size",
           str(images), "--data-dir", os.path.join(scratch, f"data{images}"), "--epochs", str(epochs),
           "--checkpoint-dir", ckpt, "--log-interval", "100000", *flags]
    if script == "main_horovod.py":
        cmd = [os.path.join(os.path.dirname(python()), "horovodrun"), "-np", "1", "--gloo", *cmd]
    t0 = time.perf_counter()
    r, rows = trainer_runs.run_trainer(cmd, ckpt, extra, timeout=400, python=python())
    if r.returncode != 0:
        raise RuntimeError(f"{name} failed: {(r.stderr.strip().splitlines() or [r.stdout[-300:]])[-1]}")
    rate = float(rows[-1]["images_per_s"])
    harness.log(f"{name}: {rate:,.0f} img/s (epoch {len(rows)}; {time.perf_counter() - t0:.0f} s in all)")
    return {"images_per_s": rate, "epoch_time_s": [float(x["epoch_time_s"]) for x in rows],
            "images": images, "command": trainer_runs.shown(cmd), "env": extra}


def prepare_data(data, scratch):
    """The folder holding cifar-10-batches-py: `data` itself, or one written from its pack."""
    if os.path.isdir(os.path.join(data, "cifar-10-batches-py")):
        return data
    maker = os.path.join(data, "make_cifar10.py")
    if not os.path.isfile(maker):
        raise RuntimeError(f"no real CIFAR-10 in {data}: run `python main.py --download` (it fills ./data) "
                           "or pass --data a folder with cifar-10-batches-py")
    real = os.path.join(scratch, "cifar")
    r = subprocess.run([python(), maker, real, *ARCH.get("subset", [])], capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"make_cifar10.py failed: {r.stderr.strip()[-300:]}")
    return real


AIRBENCH = "airbench==0.1.8"


def airbench_sdist(given, scratch):
    """airbench's sdist: the one given, else downloaded from PyPI."""
    if given:
        return given
    r = subprocess.run([python(), "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", AIRBENCH,
                        "-d", scratch], capture_output=True, text=True, timeout=120)
    found = [f for f in os.listdir(scratch) if f.startswith("airbench-")]
    if r.returncode != 0 or not found:
        raise RuntimeError(f"no airbench sdist: pass --airbench FILE ({(r.stderr.strip().splitlines() or ['?'])[-1]})")
    return os.path.join(scratch, found[0])


def anchors(sdist, real, scratch):
    out = os.path.join(scratch, "airbench.json")
    cmd = [python(), "-m", "benchmarks.gpu.airbench_anchor", "--sdist", airbench_sdist(sdist, scratch),
           "--data", real, "--runs", "3", "--out", out]
    r = subprocess.run(cmd, cwd=harness.ROOT, env=trainer_runs.env(python=python()), capture_output=True,
                       text=True, timeout=400)
    harness.log(r.stdout.strip() + (f"\n{r.stderr.strip()[-500:]}" if r.returncode else ""))
    if not os.path.exists(out):
        raise RuntimeError(f"airbench failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    with open(out) as f:
        return json.load(f)


def recipe_cmd(real, ckpt, flags=()):
    smoke = ["--epochs", ARCH["epochs"]] if "epochs" in ARCH else []
    return [python(), "main.py", "--arch", ARCH["arch"], "--recipe", "fast", "--data-dir", real,
            "--checkpoint-dir", ckpt, "--log-interval", "100000", *BF16, "--compile", *smoke, *flags]


def first_reaching(rows, target):
    hit = next((row for row in rows if float(row["test_acc"]) >= target), None) if target else None
    return float(hit["train_time_s"]) if hit else None


def accuracy(real, scratch, anchor):
    """The fast recipe's run: its accuracy without TTA (and its metrics), then the same checkpoint
    evaluated with --tta. The targets are airbench's means at the same TTA levels."""
    ckpt = os.path.join(scratch, "accuracy")
    cmd = recipe_cmd(real, ckpt)
    r, rows = trainer_runs.run_trainer(cmd, ckpt, timeout=900, python=python())
    if r.returncode != 0:
        raise RuntimeError(f"accuracy run failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    target = anchor.get("tta0_mean_acc") if anchor else None
    last = rows[-1]
    plain = {"tta": False, "test_acc": float(last["test_acc"]), "epochs": len(rows),
             "best_test_acc": max(float(x["test_acc"]) for x in rows), "train_s": float(last["train_time_s"]),
             "target": target, "target_is": "airbench94 tta0_mean_acc on the same copy",
             "time_to_target_s": first_reaching(rows, target), "command": trainer_runs.shown(cmd),
             "data": "real CIFAR-10, a JPEG copy (quality about 75) of the original images",
             "metrics": rows}
    harness.log(f"accuracy: {plain['test_acc']:.4f} after {len(rows)} epochs, {plain['train_s']:.0f} s of "
                f"training (airbench94 tta0: {target})")
    ev = [python(), "main.py", "--arch", ARCH["arch"], "--data-dir", real, "--checkpoint-dir", ckpt,
          "--evaluate", "--tta", *BF16]
    e = subprocess.run(ev, cwd=harness.ROOT, env=trainer_runs.env(python=python()), capture_output=True,
                       text=True, timeout=300)
    tta = None
    found = [ln for ln in e.stdout.splitlines() if ln.startswith("test_loss=")]
    if e.returncode == 0 and found:
        acc = float(found[-1].split("test_acc=")[1].split()[0])
        t2 = anchor.get("tta2_mean_acc") if anchor else None
        tta = {"tta": True, "test_acc": acc, "target": t2, "target_is": "airbench94 tta2_mean_acc on the same copy",
               "command": trainer_runs.shown(ev), "of": "the accuracy run's last checkpoint"}
        harness.log(f"accuracy with --tta: {acc:.4f} (airbench94 tta2: {t2})")
    else:
        harness.log(f"--evaluate --tta failed: {(e.stderr.strip().splitlines() or ['?'])[-1]}")
    return plain, tta


def time_to_anchor(real, scratch, anchor):
    """Each of TIME_RUNS with --target-acc at airbench94's tta0 mean: the training time (compiling
    included) to the first epoch that reaches it. The compiled runs share one pair of cache
    folders, empty before the first (cold) and filled by it for the others (warm)."""
    target = anchor.get("tta0_mean_acc") if anchor else ARCH.get("target")
    if not target:
        raise RuntimeError("no airbench94 tta0 mean to reach (the anchors did not run)")
    caches = {"TORCHINDUCTOR_CACHE_DIR": os.path.join(scratch, "inductor-cache"),
              "TRITON_CACHE_DIR": os.path.join(scratch, "triton-cache")}
    out = {}
    for n, (name, (epochs, compiled, cache)) in enumerate(TIME_RUNS.items()):
        ckpt = os.path.join(scratch, f"time{n}")
        flags = ["--epochs", ARCH.get("epochs", str(epochs)), "--target-acc", f"{target:.4f}"]
        cmd = recipe_cmd(real, ckpt, flags)
        if not compiled:
            cmd.remove("--compile")
        r, rows = trainer_runs.run_trainer(cmd, ckpt, caches if compiled else {}, timeout=600, python=python())
        if r.returncode != 0:
            out[name] = {"error": (r.stderr.strip().splitlines() or ["?"])[-1], "command": trainer_runs.shown(cmd)}
            continue
        out[name] = {"time_to_target_s": first_reaching(rows, target), "epochs_run": len(rows),
                     "schedule_epochs": epochs, "compiled": compiled, "compile_cache": cache,
                     "first_epoch_s": float(rows[0]["epoch_time_s"]), "test_acc": float(rows[-1]["test_acc"]),
                     "target": target, "command": trainer_runs.shown(cmd)}
        harness.log(f"time: {name}: {out[name]['time_to_target_s']} s to {target:.4f} "
                    f"(epoch 1 {out[name]['first_epoch_s']:.1f} s, {len(rows)} epochs)")
    return out


def fastest(times, cache):
    """The least time to the target among the runs with that compile cache that reached it."""
    got = [t["time_to_target_s"] for t in (times or {}).values()
           if t.get("compile_cache") == cache and t.get("time_to_target_s") is not None]
    return min(got) if got else None


def syncs(scratch):
    """The host syncs of each epoch of the bs128 bf16 compiled run, with recompilations and
    CUDA-graph decisions logged (TORCH_LOGS)."""
    ckpt = os.path.join(scratch, "syncs")
    cmd = [python(), "-m", "benchmarks.gpu.host_syncs", "main.py", "--arch", "resnet18", "--dataset", "synthetic",
           "--synthetic-size", "10000", "--data-dir", os.path.join(scratch, "data10000"), "--epochs", "2",
           "--checkpoint-dir", ckpt, "--log-interval", "100000", *BF16, "--compile"]
    env = {"TORCH_LOGS": "recompiles,perf_hints"}
    r = subprocess.run(cmd, cwd=harness.ROOT, env=trainer_runs.env(env, python()), capture_output=True,
                       text=True, timeout=400)
    epochs = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    harness.log(f"syncs: {[(e['steps'], e['syncs']) for e in epochs]}")
    logs = [ln for ln in r.stderr.splitlines() if "recompil" in ln.lower() or "cudagraph" in ln.lower()
            or "skipping" in ln.lower()]
    return {"epochs": epochs, "torch_logs": logs[:30], "returncode": r.returncode,
            "command": f"TORCH_LOGS={env['TORCH_LOGS']} " + " ".join(trainer_runs.shown(cmd))}


def ablation(real, scratch):
    """Each variant of the recipe for ABLATION_EPOCHS epochs, all at once on the GPU."""
    procs = {}
    for n, (name, flags) in enumerate(ABLATION.items()):
        ckpt = os.path.join(scratch, f"ablation{n}")
        cmd = recipe_cmd(real, ckpt, [*flags, "--epochs", ARCH.get("epochs", str(ABLATION_EPOCHS))])
        log = open(os.path.join(scratch, f"ablation{n}.log"), "w")
        procs[name] = (subprocess.Popen(cmd, cwd=harness.ROOT, env=trainer_runs.env(python=python()),
                                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL),
                       ckpt, cmd)
    out = {}
    for name, (proc, ckpt, cmd) in procs.items():
        proc.wait(timeout=900)
        rows = []
        if proc.returncode == 0:
            with open(os.path.join(ckpt, "metrics.csv")) as f:
                rows = list(csv.DictReader(f))
        out[name] = {"test_acc": float(rows[-1]["test_acc"]) if rows else None, "epochs": len(rows),
                     "returncode": proc.returncode, "command": trainer_runs.shown(cmd)}
        harness.log(f"ablation: {name}: {out[name]['test_acc']}")
    return out


def figures(res):
    """Each goal's figure from what ran; None where something it needs did not."""
    rate = {k: v["images_per_s"] for k, v in res["runs"].items()}

    def ratio(a, b):
        return rate[a] / rate[b] if a in rate and b in rate else None
    acc, tta, anchor = res.get("accuracy"), res.get("accuracy_tta"), res.get("anchors", {}).get("airbench94")

    def minus(mine, key):
        return mine["test_acc"] - anchor[key] if mine and anchor else None
    return {
        "main_bs128_bf16_img_s": rate.get("main_bs128_bf16"),
        "main_bs512_bf16_img_s": rate.get("main_bs512_bf16"),
        "speedup_vs_pytorch_cifar": ratio("main_bs128_bf16", "pytorch_cifar_pipeline"),
        "bf16_over_fp32_compiled": ratio("main_bs128_bf16", "main_bs128_fp32"),
        "bf16_over_fp32_eager": ratio("main_bs128_bf16_eager", "main_bs128_fp32_eager"),
        "accuracy_minus_airbench_tta0": minus(acc, "tta0_mean_acc"),
        "tta_accuracy_minus_airbench_tta2": minus(tta, "tta2_mean_acc"),
        "accuracy_train_s": acc["train_s"] if acc else None,
        "time_to_airbench94_tta0_cold_s": fastest(res.get("time_to_anchor"), "cold"),
        "time_to_airbench94_tta0_warm_s": fastest(res.get("time_to_anchor"), "warm"),
        "horovod_hooks_over_main_bs128_bf16": ratio("horovod_hooks_bs128_bf16", "main_bs128_bf16_same_machine"),
        "horovod_hooks_over_main_bs512_bf16": ratio("horovod_hooks_bs512_bf16", "main_bs512_bf16_same_machine"),
        "ddp_over_main_bs128_bf16": ratio("ddp_bs128_bf16", "main_bs128_bf16_beside_ddp" if
                                          "main_bs128_bf16_beside_ddp" in rate else "main_bs128_bf16_same_machine"),
        "ddp_over_main_bs512_bf16": ratio("ddp_bs512_bf16", "main_bs512_bf16_same_machine"),
        **{f"horovod_{path}_over_main_bs{b}_bf16": ratio(f"horovod_{path}_bs{b}_bf16", f"main_bs{b}_bf16_same_machine")
           for path in ("per_tensor_hooks", "regions") for b in (128, 512)},
    }


def met(value, goal):
    if goal is None:
        return None
    op, bound = goal
    return None if value is None else (value >= bound if op == ">=" else value <= bound)


def write(path, res):
    res["figures"] = {k: {"value": v, "goal": f"{GOALS[k][0]} {GOALS[k][1]:g}" if GOALS[k] else "reported",
                          "met": met(v, GOALS[k]), **({"retired": RETIRED[k]} if k in RETIRED else {})}
                      for k, v in figures(res).items()}
    with open(path + ".tmp", "w") as f:
        json.dump(res, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data",
                   help="real CIFAR-10: a folder with cifar-10-batches-py, or a pack with its make_cifar10.py "
                        "(default: %(default)s, where `python main.py --download` puts it)")
    p.add_argument("--airbench", default=None, metavar="SDIST",
                   help="airbench-0.1.8.tar.gz, the anchor (default: downloaded from PyPI)")
    p.add_argument("--out", default=os.path.join(harness.RESULTS, "results-gpu.json"))
    p.add_argument("--budget", type=float, default=900,
                   help="seconds this command may take; phases that would not fit are skipped (default: 900)")
    p.add_argument("--only", action="append", choices=("anchors", "accuracy", "time", "speed", "syncs", "ablation"),
                   default=None, help="run only these phases (repeatable; data is prepared where needed)")
    p.add_argument("--cpu-smoke", action="store_true", help="the same phases on the CPU, small")
    args = p.parse_args(argv)
    import torch
    if args.cpu_smoke:
        ARCH.update(SMOKE)
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    elif not torch.cuda.is_available():
        print("benchmarks.gpu.trainer_figures: no CUDA GPU here; these figures are of a named GPU, so run it on one",
              file=sys.stderr)
        return 1
    budget = Budget(args.budget)
    started = time.perf_counter()
    phases = args.only or ["anchors", "accuracy", "time", "speed", "syncs", "ablation"]
    if args.cpu_smoke:
        phases = [x for x in phases if x not in ("anchors", "syncs")]
    scratch = tempfile.mkdtemp(prefix="bench-gpu-")
    device = "cpu (--cpu-smoke)" if args.cpu_smoke else torch.cuda.get_device_name()
    res = {"schema": harness.SCHEMA, "device": device, "machine": harness.machine_info(),
           "first_command": " ".join(["python3", "-m", "benchmarks.gpu.trainer_figures", *(argv or sys.argv[1:])]),
           "runs": {}, "skipped": []}

    def phase(name, fn, cost=None):
        if name not in phases or not budget.allows(name, cost):
            res["skipped"].append(name)
            return None
        try:
            return fn()
        except Exception as e:  # recorded; the next phase still runs
            harness.log(f"{name}: FAILED: {e}")
            res.setdefault("failed", {})[name] = str(e)
            return None
        finally:
            res["duration_s"] = time.perf_counter() - started
            write(args.out, res)

    try:
        real = None
        if {"anchors", "accuracy", "time", "ablation"} & set(phases):
            phases.append("data")
            real = phase("data", lambda: prepare_data(args.data, scratch))
            phases = phases if real else [x for x in phases if x in ("speed", "syncs")]
        anchor = phase("anchors", lambda: anchors(args.airbench, real, scratch))
        if anchor:
            res["anchors"] = {"airbench94": anchor}
        acc = phase("accuracy", lambda: accuracy(real, scratch, anchor))
        if acc:
            res["accuracy"], res["accuracy_tta"] = acc
        times = phase("time", lambda: time_to_anchor(real, scratch, anchor))
        if times:
            res["time_to_anchor"] = times
        res["syncs"] = phase("syncs", lambda: syncs(scratch))
        for name in RUNS:
            run = phase("speed", lambda name=name: trainer_run(name, scratch))
            if run:
                res["runs"][name] = run
        res["ablation"] = phase("ablation", lambda: ablation(real, scratch))
        if res["ablation"]:
            res["ablation_epochs"] = ABLATION_EPOCHS
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    res["duration_s"] = time.perf_counter() - started
    write(args.out, res)
    for k, f in res["figures"].items():
        shown = "not run" if f["value"] is None else f"{f['value']:>12,.4g}"
        print(f"{k:36s} {shown:>12s}   goal {f['goal']:<10s} met {f['met']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
