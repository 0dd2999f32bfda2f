"""Figure horovod_compiled_over_ddp_cluster_100g: the Horovod port's efficiency under --compile
over DDP's, on an emulated cluster of 32 H100s (4 nodes of 8) with 100 Gb/s between nodes;
horovod_compiled_over_ddp_cluster_400g is the same at 400 Gb/s.

ResNet-18 at batch 128, bf16, compiled: the H100 step of results-gpu.json's main_bs128_bf16
run, split over the layers by this machine's CPU layer profile (tools/layer_profile.py, batch
32, one thread). Sides:
  Horovod, regions   what the port runs under --compile across nodes: the model compiled region
                     by region (--grad-allreduce regions, utils.compiled_regions), each region's
                     gradients to Horovod's hooks when its backward ends; Horovod's cycle 0.1 ms,
                     the port's setting on CUDA (training/ports/hvd_port.py)
  Horovod, whole     the model compiled whole, every gradient at the end of the backward, and
                     Horovod's own 1 ms cycle: how the port ran before
  DDP                its wrapper compiled, split at its buckets (DDPOptimizer)
Each side is emulated on 4 namespace hosts standing for 4 nodes of 8 GPUs (tools/emulate.py:
the real ports and allreduce, layers sleeping their times, time dilated), beside the scaling
model's prediction with its fitted constants. The value is Horovod regions' efficiency over
DDP's, both emulated, medians over the repeats (the sides alternate). Without root (namespace
hosts) the value is the model's prediction, and the figure says so ("source").
"""
import os
import shutil
import statistics
import tempfile

from benchmarks import harness
from benchmarks.scaling.gpu_cluster import GPU_EMULATED_HOSTS, GPUS_PER_NODE, h100_step_s
from tools import emulate, layer_profile, scaling_model
from training.ports import hvd_port

NAME = "horovod_compiled_over_ddp_cluster_100g"
GBPS = 100
GOAL = (">=", 0.95)
DESCRIPTION = "Horovod --compile (regions) efficiency over DDP's, 32 emulated H100s, 100 Gb/s between nodes"
RUN = "main_bs128_bf16"  # results-gpu.json's H100 step
HOSTS, GPUS_PER_HOST = GPU_EMULATED_HOSTS, GPUS_PER_NODE
SIDES = {  # name: (port, compiled, Horovod's cycle in seconds)
    "Horovod, regions": ("horovod", "regions", hvd_port.CYCLE_S[True]),
    "Horovod, whole": ("horovod", True, hvd_port.CYCLE_S[False]),
    "DDP": ("ddp", True, scaling_model.CYCLE_S),
}
FULL = dict(cluster_steps=6, cluster_warmup=2, cluster_repeats=2)
QUICK = dict(cluster_steps=2, cluster_warmup=1, cluster_repeats=1)


def profile(ctx):
    """ResNet-18's CPU layer profile (one thread), once for both figures of a run."""
    def measure():
        import torch
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return layer_profile.measure("resnet18", 32, steps=3)
        finally:
            torch.set_num_threads(threads)
    return ctx.shared(("resnet18_profile",), measure)


def predicted(prof, gbps):
    out = {}
    for name, (port, compiled, cycle) in SIDES.items():
        point = emulate.model_point(prof, HOSTS, gbps * 1e9, port, compiled=compiled, gpus_per_host=GPUS_PER_HOST)
        point["cycle_s"] = cycle
        out[name] = scaling_model.efficiency(point, scaling_model.FITTED)
    return out


def emulated(prof, gbps, cfg):
    d, shaped = emulate.dilation(gbps * 1e9, HOSTS, GPUS_PER_HOST)
    got = {name: [] for name in SIDES}
    folder = tempfile.mkdtemp(prefix="cifar-emulate-")
    try:
        with emulate.Hosts(HOSTS, shaped, folder) as hosts:
            for order in harness.alternating(list(SIDES), cfg["cluster_repeats"]):
                for name in order:
                    port, compiled, cycle = SIDES[name]
                    case = emulate.case(name, prof, compiled=compiled, steps=cfg["cluster_steps"],
                                        warmup=cfg["cluster_warmup"])
                    r = emulate.run_plan(hosts, port, [case], d, timeout=3600, cycle_s=cycle)[0]
                    got[name].append(prof["step_s"] / r["step_s"])
                    harness.log(f"{gbps} Gb/s, {name}: efficiency {got[name][-1]:.3f} (dilation {d:.0f})")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return got, d


def measure(cfg, ctx, gbps):
    cpu = profile(ctx)
    prof = layer_profile.scaled(cpu, h100_step_s(RUN), f"the H100's {RUN} step (results-gpu.json)")
    model = predicted(prof, gbps)
    out = {"setup": {"run": RUN, "gpus": HOSTS * GPUS_PER_HOST, "node_gbps": gbps, "step_s": prof["step_s"],
                     "params": scaling_model.FITTED,
                     "command": "sudo .venv/bin/python -m benchmarks.run --only " + NAME.replace("100g", f"{gbps}g")},
           "predicted": model}
    if os.geteuid() != 0:
        ratio = model["Horovod, regions"] / model["DDP"]
        return dict(out, value=ratio, repeats=[ratio], source="predicted (no root for namespace hosts)")
    got, d = emulated(prof, gbps, cfg)
    ratios = [h / p for h, p in zip(got["Horovod, regions"], got["DDP"])]
    eff = {name: statistics.median(v) for name, v in got.items()}
    return dict(out, value=eff["Horovod, regions"] / eff["DDP"], repeats=ratios, source="emulated",
                emulated=eff, emulated_repeats=got, dilation=d)


def run(cfg, ctx):
    return measure(cfg, ctx, GBPS)


def markdown(fig):
    st = fig["setup"]
    L = [f"ResNet-18, batch 128, {st['gpus']} H100s ({HOSTS} nodes of {GPUS_PER_HOST}), {st['node_gbps']} Gb/s "
         f"between nodes; one H100 step {st['step_s'] * 1e3:.2f} ms ({st['run']}). Source of the value: "
         f"{fig['source']}. Efficiency: the step of one GPU over the cluster's step.", "",
         "| side | emulated efficiency | predicted |", "|---|---|---|"]
    for name in SIDES:
        em = fig.get("emulated", {}).get(name)
        L.append(f"| {name} | {em:.3f} |" if em is not None else f"| {name} | not emulated |")
        L[-1] += f" {fig['predicted'][name]:.3f} |"
    L += ["", f"Command: `{st['command']}`"]
    return L
