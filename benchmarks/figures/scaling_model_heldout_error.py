"""Figure scaling_model_heldout_error: the scaling model (scaling_model.py) against Horovod
across 2 to 4 namespace hosts whose links carry a known rate, on points it was not fitted to.

Each point is a real `mpirun` run of main_horovod.py across hosts of scripts/local_cluster.sh
(one rank each, one thread each), with `--profile-steps`: the median step's forward, backward,
allreduce wait and optimizer step. Three models (LeNet, MobileNetV2, ResNet-18: 0.25, 9.2 and
44.7 MB of gradients), two link rates each chosen so that the allreduce is a real share of the
step, and four flag sets: none, --fp16-allreduce, --batches-per-allreduce 4, and Horovod's
fusion off (HOROVOD_FUSION_THRESHOLD=0). Each model's compute is measured at each host count
with links left unshaped.

The model is fitted on 2 and 4 hosts at each model's lower rate with no flags, fp16 and fusion
off; every other point is held out: 3 hosts, the higher rates, --batches-per-allreduce 4. The
figure is the largest relative error of the step time over the held-out points. From the
fitted model, the measured H100 step times (results-gpu.json) and ResNet-18's gradients, it
also predicts efficiency on GPU clusters (predicted, not measured).
"""
import json
import os
import shlex
import shutil
import subprocess
import sys

from benchmarks import harness, trainer_runs
from tools import scaling_model

NAME = "scaling_model_heldout_error"
GOAL = ("<=", 0.20)
DESCRIPTION = "scaling model: largest relative error of the step time on held-out namespace-host runs"
# Per model: the batch per pass, and the two link rates (Mbit/s), the first the fit's.
MODELS = {"lenet": (64, (100, 400)), "mobilenetv2": (16, (200, 800)), "resnet18": (16, (400, 1600))}
FLAGS = {"default": ([], {}), "fp16": (["--fp16-allreduce"], {"fp16": True}),
         "k4": (["--batches-per-allreduce", "4"], {"k": 4}),
         "fusion-off": ([], {"fusion": False})}
FULL = dict(hosts=(2, 3, 4), fit_hosts=(2, 4), fit_flags=("default", "fp16", "fusion-off"), models=MODELS,
            profile_steps=3)
QUICK = dict(hosts=(2,), fit_hosts=(2,), fit_flags=("default", "fp16", "fusion-off"),
             models={"lenet": (64, (100, 400))}, profile_steps=2)
SCRIPT = os.path.join(harness.ROOT, "scripts", "local_cluster.sh")
UNSHAPED_BPS = 20e9  # a veth without a token bucket: far faster than anything measured here

# GPU-cluster predictions: ResNet-18 on H100s, 8 to a node with NVLink between them.
NVLINK_BPS = 2400e9  # per GPU in a ring inside a node (NVLink 4 class, about 300 GB/s)
NODE_RATES_GBPS = (25, 100, 400)
GPUS = (1, 2, 4, 8, 16, 32, 64)
BACKWARD_SHARE = 2 / 3  # of a step's compute, for the overlap (backward costs about twice forward)


class Hosts:
    """A local cluster of n hosts, links shaped to `mbit` (None: unshaped), up for a block."""

    def __init__(self, n, mbit, scratch):
        self.env = dict(os.environ, CLUSTER_DIR=os.path.join(scratch, "hosts"), CLUSTER_NAME="bench",
                        CLUSTER_NET="169.254.88", PATH=trainer_runs.env()["PATH"])
        self.n, self.mbit = n, mbit

    def __enter__(self):
        rate = ["--rate", f"{self.mbit}mbit"] if self.mbit else []
        r = subprocess.run(["bash", SCRIPT, "up", str(self.n), *rate], env=self.env, capture_output=True,
                           text=True, timeout=600)
        if r.returncode:
            subprocess.run(["bash", SCRIPT, "down"], env=self.env, capture_output=True)
            raise RuntimeError(f"local_cluster.sh up {self.n} failed ({r.returncode}): {r.stderr[-2000:]}")
        self.vars = {}
        for line in r.stdout.splitlines():
            name, _, value = line.partition("=")
            self.vars[name] = value
        return self

    def __exit__(self, *exc):
        subprocess.run(["bash", SCRIPT, "down"], env=self.env, capture_output=True, timeout=120)

    def run(self, arch, batch, flags, env_extra, steps, ckpt, data_dir):
        """One run across the hosts: {phase: median ms per step} from --profile-steps."""
        mpirun_args = shlex.split(self.vars["CLUSTER_MPIRUN_ARGS"].strip("()"))
        k = int(flags[flags.index("--batches-per-allreduce") + 1]) if "--batches-per-allreduce" in flags else 1
        images = self.n * batch * k * steps
        images += -images % 5  # the synthetic set's size is a multiple of 5
        xs = [a for kv in env_extra.items() for a in ("-x", "=".join(kv))]
        cmd = ["bash", SCRIPT, "on", "1", "mpirun", "-np", str(self.n), "--hostfile", self.vars["CLUSTER_HOSTFILE"],
               *mpirun_args, *xs, sys.executable, os.path.join(harness.ROOT, "main_horovod.py"),
               "--arch", arch, "--dataset", "synthetic", "--synthetic-size", str(images), "--data-dir", data_dir,
               "--epochs", "1", "--batch-size", str(batch), "--lr", "0.01", "--warmup-epochs", "0",
               "--profile-steps", str(steps), "--checkpoint-dir", ckpt, *flags]
        env = dict(self.env, OMP_NUM_THREADS="1", **env_extra)
        r = subprocess.run(cmd, cwd=harness.ROOT, env=env, capture_output=True, text=True, timeout=1200)
        shutil.rmtree(ckpt, ignore_errors=True)
        ms = trainer_runs.profile_ms(r.stdout)
        if r.returncode or ms is None:
            raise RuntimeError(f"run failed ({r.returncode}): {shlex.join(cmd)}\n{r.stdout[-2000:]}\n"
                               f"{r.stderr[-3000:]}")
        return ms


def gradient_bytes(arch):
    import models
    m = models.get_model(arch, num_classes=10)
    return [p.numel() * 4 for p in m.parameters() if p.requires_grad]


def measure(cfg, ctx):
    """Every point: the unshaped compute per (model, hosts), then the shaped runs."""
    data_dir = os.path.join(ctx.scratch, "hosts-data")
    points, compute = [], {}
    rates = sorted({r for _, rs in cfg["models"].values() for r in rs})
    for n in cfg["hosts"]:
        for mbit in (None, *rates):
            todo = [a for a, (_, rs) in cfg["models"].items() if mbit is None or mbit in rs]
            with Hosts(n, mbit, ctx.scratch) as hosts:
                for arch in todo:
                    batch = cfg["models"][arch][0]
                    for name, (flags, model_flags) in FLAGS.items():
                        if mbit is None and name != "default":
                            continue
                        env_extra = {"HOROVOD_FUSION_THRESHOLD": "0"} if name == "fusion-off" else {}
                        ms = hosts.run(arch, batch, flags, env_extra, cfg["profile_steps"],
                                       os.path.join(ctx.scratch, f"hosts-{n}-{mbit}-{arch}-{name}"), data_dir)
                        harness.log(f"hosts {n}, {mbit or 'unshaped'} Mbit/s, {arch}, {name}: "
                                    + ", ".join(f"{p} {v:.0f} ms" for p, v in ms.items()))
                        if mbit is None:
                            compute[(arch, n)] = ms
                            continue
                        base = compute[(arch, n)]
                        points.append({
                            "arch": arch, "n": n, "mbit": mbit, "flags": name, "k": model_flags.get("k", 1),
                            "fp16": model_flags.get("fp16", False), "fusion": model_flags.get("fusion", True),
                            "rate_bps": mbit * 1e6, "batch": batch,
                            "compute_s": sum(base[p] for p in ("forward", "backward", "optimizer-step")) / 1e3,
                            "backward_s": base["backward"] / 1e3,
                            "step_s": sum(ms.values()) / 1e3, "allreduce_wait_s": ms["allreduce-wait"] / 1e3,
                            "phases_ms": ms})
    return points, {f"{a} {n}": ms for (a, n), ms in compute.items()}


def gpu_predictions(params):
    """Efficiency of ResNet-18 on H100s (8 to a node) by GPUs, node link, batch and flags."""
    with open(os.path.join(harness.RESULTS, "results-gpu.json")) as f:
        runs = json.load(f)["runs"]
    step = {"128": 128 / runs["main_bs128_bf16"]["images_per_s"],
            "512": 512 / runs["main_bs512_bf16"]["images_per_s"]}
    tensors = gradient_bytes("resnet18")
    out = []
    for batch, compute in step.items():
        for gbps in NODE_RATES_GBPS:
            for fp16 in (False, True):
                for k in (1, 4):
                    row = {"batch": int(batch), "node_gbps": gbps, "fp16": fp16, "k": k, "efficiency": []}
                    for n in GPUS:
                        rate = NVLINK_BPS if n <= 8 else gbps * 1e9
                        point = dict(n=n, tensors=tensors, rate_bps=rate, compute_s=compute,
                                     backward_s=BACKWARD_SHARE * compute, k=k, fp16=fp16, fusion=True)
                        row["efficiency"].append(scaling_model.efficiency(point, params))
                    out.append(row)
    return out, step


def run(cfg, ctx):
    if os.geteuid() != 0:
        return {"value": None, "skipped": "needs root, for the namespace hosts"}
    points, compute = measure(cfg, ctx)
    sizes = {arch: gradient_bytes(arch) for arch in cfg["models"]}
    for p in points:
        p["tensors"] = sizes[p["arch"]]
    fitted = [p for p in points if p["n"] in cfg["fit_hosts"] and p["flags"] in cfg["fit_flags"]
              and p["mbit"] == cfg["models"][p["arch"]][1][0]]
    held = [p for p in points if p not in fitted]
    params = scaling_model.fit(fitted)
    for p in points:
        p["predicted_step_s"] = scaling_model.step_s(p, params)
        p["relative_error"] = abs(p["predicted_step_s"] - p["step_s"]) / p["step_s"]
        p["held_out"] = p in held
    errors = [p["relative_error"] for p in held]
    gpu, gpu_step = gpu_predictions(params)
    for p in points:
        del p["tensors"]
    value = max(errors)
    return {"value": value, "repeats": [value], "mean_heldout_error": sum(errors) / len(errors),
            "fit_error": max(p["relative_error"] for p in fitted),
            "params": dict(zip(("efficiency", "latency_s", "overlap"), params)),
            "points": points, "compute_ms": compute, "gpu_step_s": gpu_step, "gpu_predictions": gpu,
            "plot": "scaling_model.png",
            "setup": {"hosts": list(cfg["hosts"]), "fit": f"hosts {list(cfg['fit_hosts'])}, each model's lower "
                      f"rate, flags {list(cfg['fit_flags'])}", "profile_steps": cfg["profile_steps"],
                      "models": {a: {"batch": b, "mbit": list(r)} for a, (b, r) in cfg["models"].items()}}}


def markdown(fig):
    e, lat, ov = fig["params"]["efficiency"], fig["params"]["latency_s"], fig["params"]["overlap"]
    held = [p for p in fig["points"] if p["held_out"]]
    worst = max(held, key=lambda p: p["relative_error"])
    L = [f"Fitted on {len(fig['points']) - len(held)} points ({fig['setup']['fit']}): a collective achieves "
         f"{e:.2f} of the link's rate, {lat * 1e3:.2f} ms per message, and hides up to {ov:.2f} of the last "
         f"backward pass; largest error on those points {fig['fit_error']:.3f}. On the {len(held)} held-out points "
         f"the mean error is {fig['mean_heldout_error']:.3f}, the largest {fig['value']:.3f} "
         f"({worst['arch']}, {worst['n']} hosts, {worst['mbit']} Mbit/s, {worst['flags']}: measured "
         f"{worst['step_s'] * 1e3:.0f} ms, predicted {worst['predicted_step_s'] * 1e3:.0f} ms).", "",
         "Largest held-out error by hosts and model (with more hosts than the machine has cores, the "
         "ranks share them):", "",
         "| hosts | " + " | ".join(sorted({p["arch"] for p in held})) + " |",
         "| --- | " + " | ".join("---" for _ in {p["arch"] for p in held}) + " |"]
    for n in sorted({p["n"] for p in held}):
        worst_of = [max((p["relative_error"] for p in held if p["n"] == n and p["arch"] == a), default=None)
                    for a in sorted({p["arch"] for p in held})]
        L.append(f"| {n} | " + " | ".join("-" if e is None else f"{e:.2f}" for e in worst_of) + " |")
    L += ["", "| model | hosts | Mbit/s | flags | step ms measured | predicted | error | allreduce wait ms "
          "| held out |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in sorted(fig["points"], key=lambda p: (p["arch"], p["n"], p["mbit"], p["flags"])):
        L.append(f"| {p['arch']} | {p['n']} | {p['mbit']} | {p['flags']} | {p['step_s'] * 1e3:.0f} | "
                 f"{p['predicted_step_s'] * 1e3:.0f} | {p['relative_error']:.3f} | {p['allreduce_wait_s'] * 1e3:.0f} | "
                 f"{'yes' if p['held_out'] else 'fit'} |")
    L += ["", f"![measured and predicted step times; predicted GPU-cluster efficiency]({fig['plot']})", "",
          "**Predicted, not measured:** ResNet-18 on H100s, 8 to a node over NVLink, at the measured single-GPU "
          "step times (batch 128: "
          f"{fig['gpu_step_s']['128'] * 1e3:.1f} ms; 512: {fig['gpu_step_s']['512'] * 1e3:.1f} ms), efficiency "
          "(1.0 = N times one GPU's images/s) by GPUs:", "",
          "| batch | node link | flags | " + " | ".join(str(n) for n in GPUS) + " |",
          "| --- | --- | --- | " + " | ".join("---" for _ in GPUS) + " |"]
    for row in fig["gpu_predictions"]:
        flags = ", ".join(f for f, on in (("fp16", row["fp16"]), (f"k={row['k']}", row["k"] > 1)) if on) or "none"
        L.append(f"| {row['batch']} | {row['node_gbps']} Gb/s | {flags} | "
                 + " | ".join(f"{e:.2f}" for e in row["efficiency"]) + " |")
    return L + [""]


def plot(fig, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    f, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for arch, marker in zip(sorted({p["arch"] for p in fig["points"]}), "os^"):
        for held, color in ((False, "C0"), (True, "C1")):
            ps = [p for p in fig["points"] if p["arch"] == arch and p["held_out"] == held]
            a.scatter([p["step_s"] for p in ps], [p["predicted_step_s"] for p in ps], marker=marker, color=color,
                      label=f"{arch}, {'held out' if held else 'fit'}", s=18)
    lim = max(p["step_s"] for p in fig["points"]) * 1.1
    a.plot([0, lim], [0, lim], color="grey", lw=0.8)
    a.set(xscale="log", yscale="log", xlabel="measured step (s)", ylabel="predicted step (s)",
          title="namespace hosts, shaped links")
    a.legend(fontsize="x-small")
    for row in fig["gpu_predictions"]:
        if row["batch"] != 128 or row["k"] != 1:
            continue
        b.plot(GPUS, row["efficiency"], marker="o", ms=3,
               ls="--" if row["fp16"] else "-", label=f"{row['node_gbps']} Gb/s" + (", fp16" if row["fp16"] else ""))
    b.set(xscale="log", xticks=GPUS, xticklabels=[str(n) for n in GPUS], ylim=(0, 1.05), xlabel="H100 GPUs",
          ylabel="efficiency (predicted)", title="ResNet-18, batch 128 per GPU, 8 GPUs a node")
    b.legend(fontsize="x-small")
    f.tight_layout()
    f.savefig(path, dpi=90)
    plt.close(f)
