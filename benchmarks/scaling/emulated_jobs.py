"""Emulated training jobs that figures share: each model's CPU layer profile scaled to a step of
GPU size, and a host count's launches run on namespace hosts (tools/emulate.py), one point of the
scaling model (tools/scaling_model.py) per case with what the emulator measured. The figures
scaling_model_heldout_error (every point of the held-out check) and probe_vs_emulator_error
(ResNet-18's training beside the allreduce probe) use it.
"""
import math

from benchmarks import harness
from benchmarks.scaling.gpu_cluster import h100_step_s
from tools import emulate, layer_profile, scaling_model

RATE_BPS = 25e9  # the emulated links' rate, in bits per second of emulated time
PROFILE_BATCH = 32
# Per model, the GPU step it computes: seconds, or the name of an H100 run of results-gpu.json.
MODELS = {"lenet": 1.3e-3, "mobilenetv2": 5e-3, "resnet18": "main_bs128_bf16"}
MODES = {"default": {}, "fp16": {"fp16": True}, "k4": {"k": 4}, "fusion-off": {"fusion": False},
         "compiled": {"compiled": True}, "hierarchical": {"compiled": True, "hierarchical": True}}


def profiles(models):
    """Each model's CPU layer profile (batch 32, one thread), scaled to its GPU step."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cpu = {arch: layer_profile.measure(arch, PROFILE_BATCH, steps=3) for arch in set(models) | {"resnet18"}}
    finally:
        torch.set_num_threads(threads)
    out = {}
    for arch in models:
        step = MODELS[arch]
        if isinstance(step, str):
            out[arch] = layer_profile.scaled(cpu[arch], h100_step_s(step), f"the H100's {step} step (results-gpu.json)")
        else:
            out[arch] = layer_profile.scaled(cpu[arch], step, f"a chosen step of {step * 1e3:g} ms")
    return out, cpu


def emulated_points(hosts, n, d, shaped, launches, profs, cfg, rate=RATE_BPS, gpus_per_host=1, tag=None):
    """Run the launches on the hosts: one point per case, with the model's point fields."""
    points = []
    for port, fusion, todo in launches:
        flags = [MODES[m] for _, m in todo]
        model = [emulate.model_point(profs[a], n, rate, port, f.get("k", 1), f.get("fp16", False),
                                     f.get("compiled", False), fusion, gpus_per_host, f.get("hierarchical", False))
                 for (a, _), f in zip(todo, flags)]
        cases = [emulate.case(f"{a} {m}", profs[a], f.get("k", 1), f.get("fp16", False), f.get("compiled", False),
                              steps_for(point, d, cfg), cfg["warmup"], f.get("hierarchical", False))
                 for (a, m), f, point in zip(todo, flags, model)]
        results = emulate.run_plan(hosts, port, cases, d, fusion, timeout=7200)
        for (arch, mode), point, r in zip(todo, model, results):
            points.append(dict(point, arch=arch, hosts=n, slots=gpus_per_host, port=port, mode=mode, tag=tag,
                               dilation=d, shaped_bps=shaped, step_s=r["step_s"], steps_s=r["steps_s"],
                               phases_s=r["phases_s"], cpu_share=emulate.cpu_share(r),
                               private_mb=max(m for m in r["private_mb"] if m is not None) if any(
                                   r["private_mb"]) else None, wall_s=r["wall_s"]))
            harness.log(f"{n} hosts{' x ' + str(gpus_per_host) if gpus_per_host > 1 else ''}, {arch}, {port} "
                        f"{mode}: step {r['step_s'] * 1e3:.2f} ms (D {d:.0f}, CPU {points[-1]['cpu_share']:.2f} "
                        f"of the cores)")
    return points


def steps_for(point, d, cfg):
    """Timed steps for a case: cfg's steps, or more, up to cfg's most, so that they last about
    cfg's timed_s of real time (by the fitted model's step); a short step is a few of Horovod's
    cycles, and its mean needs many of them."""
    real_s = scaling_model.step_s(point, scaling_model.FITTED) * d
    return max(cfg["steps"], min(cfg["max_steps"], math.ceil(cfg["timed_s"] / real_s)))
