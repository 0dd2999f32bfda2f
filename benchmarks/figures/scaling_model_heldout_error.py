"""Figure scaling_model_heldout_error: the scaling model (tools/scaling_model.py) against the
emulator (tools/emulate.py) on points it was not fitted to, from 2 to 8 namespace hosts; and the
GPU-cluster table it answers, spot-checked by the emulator.

Each point is an emulated job: one rank per namespace host, the real port (Horovod's
DistributedOptimizer under horovodrun --gloo, or DDP over gloo under a torchrun per host) and
the real allreduce over links shaped to 25 Gbit/s of emulated time, every layer sleeping its
time from a layer profile, time dilated by D so that no core is short (tools/emulate.py's
dilation(): D from 62 at 2 hosts to 250 at 8). Each point's step is the mean of its timed
steps, as many as last about 3 s of real time (3 to 30), and each point runs at D and again at
2D: a software cost of this machine that does not dilate adds up to c/D to a step. Where the step
falls from D to 2D by more than its noise, the point runs at 4D, and at 8D if it falls again,
and its step is read from where it stopped falling (without_1_over_d).
Three models, each a CPU layer profile
(tools/layer_profile.py, batch 32, one thread) scaled to a step of GPU size: ResNet-18 to the
H100's measured step (results-gpu.json, batch 128, compiled bf16: 2.70 ms), MobileNetV2 and
LeNet to 5 ms and 1.3 ms, chosen, not measured. LeNet's is off Horovod's 1 ms cycle: its
allreduce takes microseconds, so a compute of whole cycles puts the step on a step function's
edge (one cycle more or not, decided by microseconds of overhead; at 4 ms the emulator measured
4.07 ms at 2 hosts and 4.87 at 4). Horovod with no flags, --fp16-allreduce,
--batches-per-allreduce 4, fusion off (HOROVOD_FUSION_THRESHOLD=0) and the compiled backward
(--compile); DDP with no flags, --batches-per-allreduce 4 and compiled.

The model is fitted on 2 and 4 hosts: Horovod with no flags, fp16 and fusion off, and DDP with
no flags. Everything else is held out: 3, 6 and 8 hosts, --batches-per-allreduce 4, the
compiled backward. The figure is the largest relative error of the step time over the held-out
points; scaling_model_mean_error, their mean, is recorded beside it (goal 0.05).

Also recorded: each point's CPU (the ranks' share of this machine's cores while timed) and
memory, its steps at D and 2D and the software cost c; a job of 16 hosts (what this machine
holds); and the GPU-cluster table: ResNet-18 on H100s, 8 to a
node on NVLink, at 8 to 64 GPUs with 25, 100 or 400 Gb/s between nodes, predicted by the fitted
model in every cell, each row emulated at 32 GPUs (4 hosts standing for 4 nodes of 8 GPUs).
"""
import json
import math
import os
import shutil
import tempfile

from benchmarks import harness
from benchmarks.gpu_cluster import (
    GPUS,
    flags_text,
    gpu_emulate,
    gpu_markdown,
    gpu_profiles,
    gpu_rows,
    h100_step_s,
)
from tools import emulate, layer_profile, scaling_model

NAME = "scaling_model_heldout_error"
GOAL = ("<=", 0.10)
MEAN_GOAL = 0.05
DESCRIPTION = "scaling model: largest relative error of the step time on held-out emulated jobs, 2-8 hosts"
RATE_BPS = 25e9
PROFILE_BATCH = 32
# Per model, the GPU step it computes: seconds, or the name of an H100 run of results-gpu.json.
MODELS = {"lenet": 1.3e-3, "mobilenetv2": 5e-3, "resnet18": "main_bs128_bf16"}
MODES = {"default": {}, "fp16": {"fp16": True}, "k4": {"k": 4}, "fusion-off": {"fusion": False},
         "compiled": {"compiled": True}}
PORT_MODES = {"horovod": ("default", "fp16", "k4", "fusion-off", "compiled"), "ddp": ("default", "k4", "compiled")}
FIT = {("horovod", "default"), ("horovod", "fp16"), ("horovod", "fusion-off"), ("ddp", "default")}
FULL = dict(hosts=(2, 3, 4, 6, 8), fit_hosts=(2, 4), models=tuple(MODELS), ports=("horovod", "ddp"), steps=3,
            warmup=1, timed_s=3.0, max_steps=30, at_2d=True, most_d=8, capacity_hosts=16, gpu_table=True)
QUICK = dict(hosts=(2,), fit_hosts=(2,), models=("lenet",), ports=("horovod",), steps=2, warmup=1,
             timed_s=0.0, max_steps=2, at_2d=False, capacity_hosts=None, gpu_table=False)

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


def jobs(n, ports, archs):
    """The launches of one host count: (port, fusion, [(arch, mode)])."""
    out = []
    for port in ports:
        modes = [m for m in PORT_MODES[port] if m != "fusion-off"]
        out.append((port, True, [(a, m) for a in archs for m in modes]))
        if "fusion-off" in PORT_MODES[port]:
            out.append((port, False, [(a, "fusion-off") for a in archs]))
    return out


def emulated_points(hosts, n, d, shaped, launches, profs, cfg, rate=RATE_BPS, gpus_per_host=1, tag=None):
    """Run the launches on the hosts: one point per case, with the model's point fields."""
    points = []
    for port, fusion, todo in launches:
        flags = [MODES[m] for _, m in todo]
        model = [emulate.model_point(profs[a], n, rate, port, f.get("k", 1), f.get("fp16", False),
                                     f.get("compiled", False), fusion, gpus_per_host) for (a, _), f in zip(todo, flags)]
        cases = [emulate.case(f"{a} {m}", profs[a], f.get("k", 1), f.get("fp16", False), f.get("compiled", False),
                              steps_for(point, d, cfg), cfg["warmup"])
                 for (a, m), f, point in zip(todo, flags, model)]
        results = emulate.run_plan(hosts, port, cases, d, fusion, timeout=7200)
        for (arch, mode), point, r in zip(todo, model, results):
            points.append(dict(point, arch=arch, hosts=n, port=port, mode=mode, tag=tag, dilation=d,
                               shaped_bps=shaped, step_s=r["step_s"], steps_s=r["steps_s"],
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


def mean_se(steps):
    """The mean of a point's timed steps and its standard error."""
    m = sum(steps) / len(steps)
    var = sum((x - m) ** 2 for x in steps) / (len(steps) - 1) if len(steps) > 1 else 0.0
    return m, (var / len(steps)) ** 0.5


def falls(a, b):
    """Whether the mean step of `a` exceeds that of `b` by more than twice their standard error."""
    (s1, e1), (s2, e2) = mean_se(a["steps_s"]), mean_se(b["steps_s"])
    return s1 - s2 > 2 * (e1 * e1 + e2 * e2) ** 0.5


def without_1_over_d(at_d, at_2d, *further):
    """One point from the same job at D and 2D and, where the step kept falling, at 4D, 8D, ...
    (`further`, each the next doubling). A software cost that does not dilate (gloo's messages,
    Python, between ranks sharing the cores) adds at most c/D to an emulated step. It can add
    less: Horovod's step is a whole number of its cycles, so a cost that fits the slack of the
    last cycle adds nothing, and one that outgrows it adds a cycle. As a function of 1/D the step
    is then flat near 0 and rises further out (convex), so the line through two dilations,
    extrapolated to 1/D = 0, falls at or below the true step (at it for a cost of exactly c/D),
    and the step at the larger D lies above it. Where no fall shows from D to 2D (more than twice
    their standard error), the step is the mean of all the timed steps. Where it falls: the mean
    of the steps at the first two dilations between which it stopped falling; if it still fell
    between the last two that ran, the middle of [2 step(last) - step(before), step(last)] (the
    bracket is kept); with only D and 2D, 2 step(2D) - step(D).
    Keeps every dilation's steps and c = D (step(D) - step), in real seconds."""
    runs = [at_d, at_2d, *further]
    means = [mean_se(r["steps_s"])[0] for r in runs]
    term = falls(at_d, at_2d)
    out = dict(at_d, step_s_at_d=means[0], one_over_d_term=term, cpu_share=max(r["cpu_share"] for r in runs))
    for i, (r, m) in enumerate(zip(runs[1:], means[1:])):
        out.update({f"step_s_at_{2 ** (i + 1)}d": m, f"steps_s_at_{2 ** (i + 1)}d": r["steps_s"]})
    pooled = lambda *ps: sum(sum(p["steps_s"]) for p in ps) / sum(len(p["steps_s"]) for p in ps)  # noqa: E731
    stopped = next((i for i in range(2, len(runs)) if not falls(runs[i - 1], runs[i])), None)
    bracket = None
    if not term:
        step = pooled(*runs)
    elif len(runs) == 2:
        step = 2 * means[1] - means[0]
    elif stopped is not None:
        step = pooled(runs[stopped - 1], runs[stopped])
    else:
        bracket = [2 * means[-1] - means[-2], means[-1]]
        step = sum(bracket) / 2
    software = at_d["dilation"] * (means[0] - step) if term else 0.0
    return dict(out, step_s=step, step_bracket_s=bracket, software_s=software)


def measure(cfg, profs, folder):
    """Every point of the held-out check: each at D, at 2D where cfg says at_2d, and at 4D, 8D,
    ... up to cfg's most_d times D while its step keeps falling (see without_1_over_d); and the
    capacity job."""
    points = []
    for n in cfg["hosts"]:
        d, shaped = emulate.dilation(RATE_BPS, n)
        launches = jobs(n, cfg["ports"], cfg["models"])
        with emulate.Hosts(n, shaped, folder) as hosts:
            at_d = emulated_points(hosts, n, d, shaped, launches, profs, cfg)
        if not cfg.get("at_2d"):
            points += at_d
            continue
        with emulate.Hosts(n, shaped / 2, folder) as hosts:
            at_2d = emulated_points(hosts, n, 2 * d, shaped / 2, launches, profs, cfg)
        key = lambda p: (p["port"], p["arch"], p["mode"])  # noqa: E731
        runs = {key(p1): [p1, p2] for p1, p2 in zip(at_d, at_2d)}
        falling, factor = {k for k, (p1, p2) in runs.items() if falls(p1, p2)}, 2
        while falling and 2 * factor <= cfg.get("most_d", 2):
            factor *= 2
            again = [(port, fusion, [(a, m) for a, m in todo if (port, a, m) in falling])
                     for port, fusion, todo in launches]
            with emulate.Hosts(n, shaped / factor, folder) as hosts:
                for p in emulated_points(hosts, n, factor * d, shaped / factor, [x for x in again if x[2]], profs,
                                         cfg):
                    runs[key(p)].append(p)
            falling = {k for k in falling if falls(runs[k][-2], runs[k][-1])}
        for p1 in at_d:
            p = without_1_over_d(*runs[key(p1)])
            points.append(p)
            harness.log(f"{n} hosts, {p['arch']}, {p['port']} {p['mode']}: "
                        + ", ".join(f"{r['step_s'] * 1e3:.2f} ms at {2 ** i}D".replace(" 1D", " D")
                                    for i, r in enumerate(runs[key(p1)]))
                        + f": {p['step_s'] * 1e3:.2f} ms")
    if cfg["capacity_hosts"]:
        n = cfg["capacity_hosts"]
        d, shaped = emulate.dilation(RATE_BPS, n)
        with emulate.Hosts(n, shaped, folder) as hosts:
            points += emulated_points(hosts, n, d, shaped, [("horovod", True, [("lenet", "default")])], profs, cfg,
                                      tag="capacity")
    return points


def run(cfg, ctx):
    if os.geteuid() != 0:
        return {"value": None, "skipped": "needs root, for the namespace hosts"}
    profs, cpu = profiles(cfg["models"])
    folder = tempfile.mkdtemp(prefix="cifar-emulate-")
    try:
        points = measure(cfg, profs, folder)
        main = [p for p in points if p["tag"] is None]
        fitted = [p for p in main if p["hosts"] in cfg["fit_hosts"] and (p["port"], p["mode"]) in FIT]
        held = [p for p in main if p not in fitted]
        params = scaling_model.fit(fitted)
        for p in points:
            p["predicted_step_s"] = scaling_model.step_s(p, params)
            p["relative_error"] = abs(p["predicted_step_s"] - p["step_s"]) / p["step_s"]
            p["held_out"] = p in held
        gpu = None
        if cfg["gpu_table"]:
            gprofs = gpu_profiles(cpu)
            gpu = gpu_rows(params, gprofs, MODES)
            gpu_emulate(gpu, gprofs, cfg, folder, MODES)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for p in points:  # the model's inputs are long lists, rebuilt from the profiles kept below
        for key in ("tensors", "ready"):
            p.pop(key, None)
    errors = [p["relative_error"] for p in held]
    value = max(errors)
    return {"value": value, "repeats": [value], "scaling_model_mean_error": sum(errors) / len(errors),
            "mean_goal": MEAN_GOAL, "fit_error": max(p["relative_error"] for p in fitted),
            "params": dict(zip(("efficiency", "latency_s", "spread"), params)), "points": points,
            "profiles": {a: {k: p[k] for k in ("source", "forward_s", "backward_s", "optimizer_s", "step_s",
                                               "arch", "layers", "tail_s")}
                         for a, p in profs.items()},
            "gpu_table": gpu, "plot": "scaling_model.png",
            "setup": {"hosts": list(cfg["hosts"]), "rate_bps": RATE_BPS, "steps": cfg["steps"], "warmup": cfg["warmup"],
                      "fit": f"hosts {list(cfg['fit_hosts'])}: " + ", ".join(f"{p} {m}" for p, m in sorted(FIT)),
                      "link_budget_bps": emulate.LINK_BUDGET_BPS}}


# ============================================================================
# RESULTS.md

def markdown(fig):
    e, lat = fig["params"]["efficiency"], fig["params"]["latency_s"]
    spread = fig["params"].get("spread", 0.0)
    held = [p for p in fig["points"] if p["held_out"]]
    fit = [p for p in fig["points"] if p["tag"] is None and not p["held_out"]]
    worst = max(held, key=lambda p: p["relative_error"])
    archs = sorted({p["arch"] for p in held})
    L = [f"Emulated jobs (tools/emulate.py), links of {fig['setup']['rate_bps'] / 1e9:g} Gbit/s, each rank's layers "
         "sleeping a GPU-size step: " + "; ".join(f"{a}: {p['step_s'] * 1e3:.2f} ms, {p['source']}"
                                                  for a, p in fig["profiles"].items()) + ".", "",
         f"Fitted on {len(fit)} points ({fig['setup']['fit']}): a collective achieves {e:.2f} of the link's rate, "
         f"{lat * 1e6:.0f} us per message, a ring's wire time stretched by {spread:.2f} x log2(N / 2) (the "
         f"slowest link at each of its steps); largest error on those points {fig['fit_error']:.3f}. On the "
         f"{len(held)} held-out points the largest error is **{fig['value']:.3f}** (goal {GOAL[1]}) and the mean "
         f"**{fig['scaling_model_mean_error']:.3f}** (`scaling_model_mean_error`, goal {fig['mean_goal']}); the "
         f"worst: {worst['arch']}, {worst['hosts']} hosts, {flags_text(worst['port'], worst['mode'])}: emulated "
         f"{worst['step_s'] * 1e3:.2f} ms, predicted {worst['predicted_step_s'] * 1e3:.2f} ms.", "",
         "Largest held-out error by hosts and model:", "",
         "| hosts | " + " | ".join(archs) + " | time dilation D | ranks' CPU (share of the cores, most) | "
         "private memory a rank (MB, most) |",
         "| --- | " + " | ".join("---" for _ in archs) + " | --- | --- | --- |"]
    for n in sorted({p["hosts"] for p in fig["points"] if p["tag"] is None}):
        at = [p for p in fig["points"] if p["hosts"] == n and p["tag"] is None]
        worst_of = [max((p["relative_error"] for p in held if p["hosts"] == n and p["arch"] == a), default=None)
                    for a in archs]
        mem = [p["private_mb"] for p in at if p["private_mb"]]
        L.append(f"| {n} | " + " | ".join("-" if x is None else f"{x:.3f}" for x in worst_of)
                 + f" | {at[0]['dilation']:.0f} | {max(p['cpu_share'] for p in at):.2f} | "
                 + (f"{max(mem):.0f}" if mem else "n/a") + " |")
    extra = [p for p in fig["points"] if p["tag"]]
    if extra:
        L += ["", "Beside them (not in the figure):", ""]
        for p in extra:
            L.append(f"- {p['tag']}: {p['arch']}, {p['hosts']} hosts, {flags_text(p['port'], p['mode'])}, D "
                     f"{p['dilation']:.0f}: emulated {p['step_s'] * 1e3:.2f} ms, predicted "
                     f"{p['predicted_step_s'] * 1e3:.2f} ms (error {p['relative_error']:.3f}), the ranks' CPU "
                     f"{p['cpu_share']:.2f} of the cores" + (f", {p['private_mb']:.0f} MB private a rank"
                                                             if p["private_mb"] else ""))
    paired = [p for p in fig["points"] if "step_s_at_2d" in p]
    if paired:
        fell = [p for p in paired if p["one_over_d_term"]]
        again = [p for p in fell if "step_s_at_4d" in p]
        deeper = ", ".join(f"{sum(f'step_s_at_{k}d' in p for p in fell)} at {k}D" for k in (4, 8, 16)
                           if any(f"step_s_at_{k}d" in p for p in fell))
        L += ["", f"Each point ran at D and at 2D; {len(fell)} of {len(paired)} steps fell at 2D by more than "
              f"their noise" + (f", and ran again while the step kept falling: {deeper}" if deeper else "")
              + ". Where it stopped falling the step is the mean of the steps at the two dilations it stopped "
              "between; where it still fell between the last two that ran, the middle of [2 step(last) - "
              f"step(before), step(last)] ({sum(p['step_bracket_s'] is not None for p in again)} points); "
              + (f"{len(fell) - len(again)} without 4D are 2 step(2D) - step(D); " if len(fell) > len(again) else "")
              + "the points that did not fall are the mean of all their steps. The largest software cost taken "
              f"away: {max(p['software_s'] for p in paired):.2f} s of real time a step."]
    L += ["", "| model | hosts | port and flags | emulated ms | at D | at 2D | at 4D | at 8D | predicted ms | error | "
          "D | CPU | held out |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    ms = lambda p, k: f"{p[k] * 1e3:.2f}" if k in p else "-"  # noqa: E731
    for p in sorted((p for p in fig["points"] if p["tag"] is None),
                    key=lambda p: (p["arch"], p["hosts"], p["port"], p["mode"])):
        at = " | ".join(ms(p, f"step_s_at_{k}d") for k in ("", 2, 4, 8)) if "step_s_at_2d" in p \
            else f"{p['step_s'] * 1e3:.2f} | - | - | -"
        L.append(f"| {p['arch']} | {p['hosts']} | {flags_text(p['port'], p['mode'])} | {p['step_s'] * 1e3:.2f} | "
                 f"{at} | {p['predicted_step_s'] * 1e3:.2f} | {p['relative_error']:.3f} | {p['dilation']:.0f} | "
                 f"{p['cpu_share']:.2f} | {'yes' if p['held_out'] else 'fit'} |")
    L += ["", f"![emulated and predicted step times; predicted GPU-cluster efficiency]({fig['plot']})", ""]
    if fig.get("gpu_table"):
        L += gpu_markdown(fig["gpu_table"])
    return L + [""]


def plot(fig, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    f, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    main = [p for p in fig["points"] if p["tag"] is None]
    for arch, marker in zip(sorted({p["arch"] for p in main}), "os^"):
        for held, color in ((False, "C0"), (True, "C1")):
            ps = [p for p in main if p["arch"] == arch and p["held_out"] == held]
            a.scatter([p["step_s"] * 1e3 for p in ps], [p["predicted_step_s"] * 1e3 for p in ps], marker=marker,
                      color=color, label=f"{arch}, {'held out' if held else 'fit'}", s=18)
    lim = max(p["step_s"] for p in main) * 1.1e3
    a.plot([0, lim], [0, lim], color="grey", lw=0.8)
    a.set(xscale="log", yscale="log", xlabel="emulated step (ms)", ylabel="predicted step (ms)",
          title="emulated jobs, 2-8 hosts")
    a.legend(fontsize="x-small")
    for r in fig.get("gpu_table") or []:
        if r["batch"] != 128 or r["port"] != "horovod" or r["mode"] != "default":
            continue
        line, = b.plot(GPUS, r["efficiency"], marker="o", ms=3, ls="--" if r["setup"] == "--compile" else "-",
                       label=f"{r['node_gbps']} Gb/s, {r['setup']}")
        if r.get("emulated"):
            b.scatter([r["emulated"]["gpus"]], [r["emulated"]["efficiency"]], marker="x", color=line.get_color())
    b.set(xscale="log", xticks=GPUS, xticklabels=[str(n) for n in GPUS], ylim=(0, 1.05), xlabel="H100 GPUs",
          ylabel="efficiency", title="ResNet-18, batch 128, Horovod (x: emulated)")
    b.legend(fontsize="x-small")
    f.tight_layout()
    f.savefig(path, dpi=90)
    plt.close(f)


def main(argv=None):
    """A part of the figure, on chosen hosts, models and ports: its points and errors as JSON."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m benchmarks.figures.scaling_model_heldout_error",
                                description=main.__doc__)
    p.add_argument("--hosts", default="2,3,4,6,8", help="host counts (default: %(default)s)")
    p.add_argument("--models", default=",".join(MODELS), help="(default: %(default)s)")
    p.add_argument("--ports", default="horovod,ddp", help="(default: %(default)s)")
    p.add_argument("--single-d", action="store_true", help="each point at D alone, not at D and 2D")
    p.add_argument("--out", required=True, help="the JSON to write")
    args = p.parse_args(argv)
    hosts = tuple(int(x) for x in args.hosts.split(","))
    cfg = dict(FULL, hosts=hosts, fit_hosts=tuple(h for h in FULL["fit_hosts"] if h in hosts),
               models=tuple(args.models.split(",")), ports=tuple(args.ports.split(",")), at_2d=not args.single_d,
               capacity_hosts=None, gpu_table=False)
    fig = run(cfg, None)
    with open(args.out, "w") as f:
        json.dump(fig, f, indent=1)
    if fig.get("value") is not None:
        print("\n".join(markdown(dict(fig, plot="(not drawn)"))))
    return 0 if fig.get("value") is not None else 1


if __name__ == "__main__":
    import sys
    sys.exit(main())
