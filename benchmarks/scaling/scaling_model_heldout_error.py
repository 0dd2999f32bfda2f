"""Figure scaling_model_heldout_error: the scaling model (tools/scaling_model.py) against the
emulator (tools/emulate.py) on points it was not fitted to, from 2 to 16 namespace hosts; and the
GPU-cluster table it answers, spot-checked by the emulator.

Each point is an emulated job: one rank per namespace host, the real port (Horovod's
DistributedOptimizer under horovodrun --gloo, or DDP over gloo under a torchrun per host) and
the real allreduce over links shaped to 25 Gbit/s of emulated time, every layer sleeping its
time from a layer profile, time dilated by D so that no core is short (tools/emulate.py's
dilation(): D from 62 at 2 hosts to 250 at 8 and 500 at 16). Each point's step is the mean of its timed
steps, as many as last about 3 s of real time (3 to 30), and each point runs at D and again at
2D: a software cost of this machine that does not dilate adds up to c/D to a step. Where the step
falls from D to 2D by more than its noise, the point runs at 4D, and at 8D if it falls again,
and its step is read from where it stopped falling (benchmarks/scaling/dilated.py).
Three models, each a CPU layer profile
(tools/layer_profile.py, batch 32, one thread) scaled to a step of GPU size: ResNet-18 to the
H100's measured step (results-gpu.json, batch 128, compiled bf16: 2.70 ms), MobileNetV2 and
LeNet to 5 ms and 1.3 ms, chosen, not measured. LeNet's is off Horovod's 1 ms cycle: its
allreduce takes microseconds, so a compute of whole cycles puts the step on a step function's
edge (one cycle more or not, decided by microseconds of overhead; at 4 ms the emulator measured
4.07 ms at 2 hosts and 4.87 at 4). Horovod with no flags, --fp16-allreduce,
--batches-per-allreduce 4, fusion off (HOROVOD_FUSION_THRESHOLD=0) and the compiled backward
(--compile); DDP with no flags, --batches-per-allreduce 4 and compiled. At 16 hosts (wide_hosts)
each port's defaults and Horovod compiled. And the hierarchical allreduce (hierarchical_hosts: 2
and 4 hosts of 2 ranks each, MobileNetV2 and ResNet-18): Horovod compiled, its one message
summed by HOROVOD_HIERARCHICAL_ALLREDUCE's steps composed of Horovod's collectives
(tools/emulated_rank.py's Composed), a host's 2 ranks over its loopback, unshaped: a node's
links taken as free.

The model is fitted on 2 and 4 hosts: Horovod with no flags, fp16 and fusion off, and DDP with
no flags. Everything else is held out: 3, 6, 8 and 16 hosts, --batches-per-allreduce 4, the
compiled backward, the hierarchical allreduce. The figure is the largest relative error of the
step time over the held-out points; scaling_model_mean_error, their mean, is recorded beside it
(goal 0.05). `python -m benchmarks.scaling.scaling_model_heldout_error --add` measures some of
the points and puts them into a committed figure, predicted by its fitted params (`added`
records each such run).

Also recorded: each point's CPU (the ranks' share of this machine's cores while timed) and
memory, its steps at D and 2D and the software cost c; and the GPU-cluster table: ResNet-18 on H100s, 8 to a
node on NVLink, at 8 to 64 GPUs with 25, 100 or 400 Gb/s between nodes, predicted by the fitted
model in every cell, each row emulated at 32 GPUs (4 hosts standing for 4 nodes of 8 GPUs).
"""
import json
import os
import shutil
import tempfile

from benchmarks import harness
from benchmarks.scaling import dilated
from benchmarks.scaling.emulated_jobs import MODELS, MODES, RATE_BPS, emulated_points, profiles
from benchmarks.scaling.gpu_cluster import GPUS, flags_text, gpu_emulate, gpu_markdown, gpu_profiles, gpu_rows
from tools import emulate, scaling_model

NAME = "scaling_model_heldout_error"
GOAL = ("<=", 0.10)
MEAN_GOAL = 0.05
DESCRIPTION = "scaling model: largest relative error of the step time on held-out emulated jobs, 2-16 hosts"
PORT_MODES = {"horovod": ("default", "fp16", "k4", "fusion-off", "compiled"), "ddp": ("default", "k4", "compiled")}
# At the widest hosts (wide_hosts), each port's defaults and the compiled backward.
WIDE_MODES = {"horovod": ("default", "compiled"), "ddp": ("default",)}
# Hierarchical points (hierarchical_hosts): SLOTS ranks a host, the models with the most bytes.
SLOTS, HIERARCHICAL_MODELS = 2, ("mobilenetv2", "resnet18")
FIT = {("horovod", "default"), ("horovod", "fp16"), ("horovod", "fusion-off"), ("ddp", "default")}
FULL = dict(hosts=(2, 3, 4, 6, 8), wide_hosts=(16,), hierarchical_hosts=(2, 4), fit_hosts=(2, 4),
            models=tuple(MODELS), ports=("horovod", "ddp"), steps=3, warmup=1, timed_s=3.0, max_steps=30, at_2d=True,
            most_d=8, gpu_table=True)
QUICK = dict(hosts=(2,), fit_hosts=(2,), models=("lenet",), ports=("horovod",), steps=2, warmup=1,
             timed_s=0.0, max_steps=2, at_2d=False, gpu_table=False)

def jobs(ports, archs, port_modes=PORT_MODES):
    """The launches of one host count: (port, fusion, [(arch, mode)])."""
    out = []
    for port in ports:
        modes = [m for m in port_modes[port] if m != "fusion-off"]
        out.append((port, True, [(a, m) for a in archs for m in modes]))
        if "fusion-off" in port_modes[port]:
            out.append((port, False, [(a, "fusion-off") for a in archs]))
    return out


def groups(cfg):
    """(hosts, ranks a host, launches) of every host count the figure runs: every mode at
    cfg's hosts, WIDE_MODES at its wide_hosts, and the hierarchical allreduce of
    HIERARCHICAL_MODELS at its hierarchical_hosts, SLOTS ranks a host."""
    out = [(n, 1, jobs(cfg["ports"], cfg["models"])) for n in cfg["hosts"]]
    out += [(n, 1, jobs(cfg["ports"], cfg["models"], WIDE_MODES)) for n in cfg.get("wide_hosts", ())]
    tall = [a for a in cfg["models"] if a in HIERARCHICAL_MODELS]
    return out + [(n, SLOTS, [("horovod", True, [(a, "hierarchical") for a in tall])])
                  for n in cfg.get("hierarchical_hosts", ()) if tall]


def measure(cfg, profs, folder):
    """Every point of the held-out check (groups): each at D, at 2D where cfg says at_2d, and
    at 4D, 8D, ... up to cfg's most_d times D while its step keeps falling (see
    dilated.without_1_over_d). A group of several ranks a host has the same D as one rank a host: its
    links carry the same bytes, its cycles come no closer than CYCLES_APART allows."""
    points = []
    for n, slots, launches in groups(cfg):
        d, shaped = emulate.dilation(RATE_BPS, n)
        d = max(d, n * slots * emulate.CYCLES_APART_S / scaling_model.CYCLE_S)
        shaped = RATE_BPS / d
        with emulate.Hosts(n, shaped, folder, slots) as hosts:
            at_d = emulated_points(hosts, n, d, shaped, launches, profs, cfg, gpus_per_host=slots)
        if not cfg.get("at_2d"):
            points += at_d
            continue
        with emulate.Hosts(n, shaped / 2, folder, slots) as hosts:
            at_2d = emulated_points(hosts, n, 2 * d, shaped / 2, launches, profs, cfg, gpus_per_host=slots)
        key = lambda p: (p["port"], p["arch"], p["mode"])  # noqa: E731
        runs = {key(p1): [p1, p2] for p1, p2 in zip(at_d, at_2d)}
        falling, factor = {k for k, (p1, p2) in runs.items() if dilated.falls(p1, p2)}, 2
        while falling and 2 * factor <= cfg.get("most_d", 2):
            factor *= 2
            again = [(port, fusion, [(a, m) for a, m in todo if (port, a, m) in falling])
                     for port, fusion, todo in launches]
            with emulate.Hosts(n, shaped / factor, folder, slots) as hosts:
                for p in emulated_points(hosts, n, factor * d, shaped / factor, [x for x in again if x[2]], profs,
                                         cfg, gpus_per_host=slots):
                    runs[key(p)].append(p)
            falling = {k for k in falling if dilated.falls(runs[k][-2], runs[k][-1])}
        for p1 in at_d:
            p = dilated.without_1_over_d(*runs[key(p1)])
            points.append(p)
            harness.log(f"{n} hosts x {slots}, {p['arch']}, {p['port']} {p['mode']}: "
                        + ", ".join(f"{r['step_s'] * 1e3:.2f} ms at {2 ** i}D".replace(" 1D", " D")
                                    for i, r in enumerate(runs[key(p1)]))
                        + f": {p['step_s'] * 1e3:.2f} ms")
    return points


def run(cfg, ctx):
    if os.geteuid() != 0:
        return {"value": None, "skipped": "needs root, for the namespace hosts"}
    profs, cpu = profiles(cfg["models"])
    folder = tempfile.mkdtemp(prefix="cifar-emulate-")
    try:
        points = measure(cfg, profs, folder)
        fitted = [p for p in points if p["hosts"] in cfg["fit_hosts"] and p["slots"] == 1
                  and (p["port"], p["mode"]) in FIT]
        params = scaling_model.fit(fitted)
        fig = judged({"params": dict(zip(("efficiency", "latency_s", "spread"), params))}, points, fitted)
        gpu = None
        if cfg["gpu_table"]:
            gprofs = gpu_profiles(cpu)
            gpu = gpu_rows(params, gprofs, MODES)
            gpu_emulate(gpu, gprofs, cfg, folder, MODES)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return dict(fig, mean_goal=MEAN_GOAL,
                profiles={a: {k: p[k] for k in ("source", "forward_s", "backward_s", "optimizer_s", "step_s",
                                                 "arch", "layers", "tail_s")} for a, p in profs.items()},
                gpu_table=gpu, plot="scaling_model.png",
                setup={"hosts": list(cfg["hosts"]), "wide_hosts": list(cfg.get("wide_hosts", ())),
                       "hierarchical_hosts": list(cfg.get("hierarchical_hosts", ())), "rate_bps": RATE_BPS,
                       "steps": cfg["steps"], "warmup": cfg["warmup"],
                       "fit": f"hosts {list(cfg['fit_hosts'])}: " + ", ".join(f"{p} {m}" for p, m in sorted(FIT)),
                       "link_budget_bps": emulate.LINK_BUDGET_BPS})


def judged(fig, points, fitted):
    """fig with `points`, each predicted by fig's params and marked held out unless in `fitted`,
    and the figure's value (the largest held-out error), mean and fit error."""
    params = tuple(fig["params"][k] for k in ("efficiency", "latency_s", "spread"))
    held = [p for p in points if p not in fitted]
    for p in points:
        p["predicted_step_s"] = scaling_model.step_s(p, params)
        p["relative_error"] = abs(p["predicted_step_s"] - p["step_s"]) / p["step_s"]
        p["held_out"] = p in held
    for p in points:  # the model's inputs are long lists, rebuilt from the profiles kept
        for key in ("tensors", "ready"):
            p.pop(key, None)
    errors = [p["relative_error"] for p in held]
    return dict(fig, value=max(errors), repeats=[max(errors)], scaling_model_mean_error=sum(errors) / len(errors),
                fit_error=max(p["relative_error"] for p in fitted), points=points)


def add(cfg, path):
    """Measure cfg's groups and put their points, held out, into the figure kept in the
    results.json at `path` (in place of its points of the same hosts, ranks a host, port, model
    and mode), predicted by its fitted params from its profiles: the figure's value and mean
    then count them."""
    with open(path) as f:
        res = json.load(f)
    fig = res["figures"][NAME]
    folder = tempfile.mkdtemp(prefix="cifar-emulate-")
    try:
        new = measure(cfg, fig["profiles"], folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    key = lambda p: (p["hosts"], p.get("slots", 1), p["port"], p["arch"], p["mode"])  # noqa: E731
    keep = [p for p in fig["points"] if key(p) not in {key(q) for q in new} and p["tag"] is None]
    for p in keep:  # their model inputs, from the profiles, as measure() made them
        f = MODES[p["mode"]]
        p.update(emulate.model_point(fig["profiles"][p["arch"]], p["hosts"], p["rate_bps"], p["port"],
                                     f.get("k", 1), f.get("fp16", False), f.get("compiled", False), p["fusion"],
                                     p.get("slots", 1), f.get("hierarchical", False)))
    points = keep + new
    res["figures"][NAME] = judged(fig, points, [p for p in keep if not p.get("held_out", True)])
    setup = res["figures"][NAME]["setup"]
    for k in ("hosts", "wide_hosts", "hierarchical_hosts"):
        setup[k] = sorted({*setup.get(k, ()), *cfg.get(k, ())})
    return res
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
    where = lambda p: (p["hosts"], p.get("slots", 1))  # noqa: E731
    for n, slots in sorted({where(p) for p in fig["points"] if p["tag"] is None}):
        at = [p for p in fig["points"] if where(p) == (n, slots) and p["tag"] is None]
        worst_of = [max((p["relative_error"] for p in held if where(p) == (n, slots) and p["arch"] == a),
                        default=None) for a in archs]
        mem = [p["private_mb"] for p in at if p["private_mb"]]
        at_n = f"{n} x {slots}, hierarchical" if slots > 1 else f"{n}"
        L.append(f"| {at_n} | " + " | ".join("-" if x is None else f"{x:.3f}" for x in worst_of)
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
                    key=lambda p: (p["arch"], p["hosts"], p.get("slots", 1), p["port"], p["mode"])):
        at = " | ".join(ms(p, f"step_s_at_{k}d") for k in ("", 2, 4, 8)) if "step_s_at_2d" in p \
            else f"{p['step_s'] * 1e3:.2f} | - | - | -"
        on = f"{p['hosts']} x {p['slots']}" if p.get("slots", 1) > 1 else f"{p['hosts']}"
        L.append(f"| {p['arch']} | {on} | {flags_text(p['port'], p['mode'])} | {p['step_s'] * 1e3:.2f} | "
                 f"{at} | {p['predicted_step_s'] * 1e3:.2f} | {p['relative_error']:.3f} | {p['dilation']:.0f} | "
                 f"{p['cpu_share']:.2f} | {'yes' if p['held_out'] else 'fit'} |")
    for a in fig.get("added", ()):
        L += ["", f"Points measured later and put into this figure, predicted by the same fitted params: "
              f"`{a['command']}` ({a['date_utc']}, commit {a['commit']})."]
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
          title="emulated jobs, 2-16 hosts")
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
    """A part of the figure, on chosen hosts, models and ports: its points and errors as JSON;
    or, with --add, those points put into the figure of a results.json (add)."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m benchmarks.scaling.scaling_model_heldout_error",
                                description=main.__doc__)
    p.add_argument("--hosts", default="2,3,4,6,8", help="host counts, every mode (default: %(default)s)")
    p.add_argument("--wide-hosts", default="", help="host counts, WIDE_MODES only (e.g. 16)")
    p.add_argument("--hierarchical-hosts", default="", help=f"host counts of {SLOTS} ranks, hierarchical (e.g. 2,4)")
    p.add_argument("--models", default=",".join(MODELS), help="(default: %(default)s)")
    p.add_argument("--ports", default="horovod,ddp", help="(default: %(default)s)")
    p.add_argument("--single-d", action="store_true", help="each point at D alone, not at D and 2D")
    p.add_argument("--add", action="store_true", help="put the points into --out's figure (a results.json), "
                   "predicted by its fitted params, and rewrite it and its RESULTS.md")
    p.add_argument("--out", required=True, help="the JSON to write")
    args = p.parse_args(argv)
    counts = lambda text: tuple(int(x) for x in text.split(",") if x)  # noqa: E731
    hosts = counts(args.hosts)
    cfg = dict(FULL, hosts=hosts, wide_hosts=counts(args.wide_hosts),
               hierarchical_hosts=counts(args.hierarchical_hosts),
               fit_hosts=tuple(h for h in FULL["fit_hosts"] if h in hosts), models=tuple(args.models.split(",")),
               ports=tuple(args.ports.split(",")), at_2d=not args.single_d, gpu_table=False)
    if args.add:
        import datetime
        import shlex
        import subprocess
        import sys

        res = add(cfg, args.out)
        res["figures"][NAME].setdefault("added", []).append(
            {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
             "commit": harness.machine_info()["commit"],
             "command": shlex.join(["python", "-m", "benchmarks.scaling.scaling_model_heldout_error",
                                    *(sys.argv[1:] if argv is None else argv)])})
        harness.write_json(res, args.out)
        # The page is every figure's: benchmarks.run, which holds their registry, judges and writes it.
        subprocess.run([sys.executable, "-m", "benchmarks.run", "--render", "--out", os.path.dirname(args.out)],
                       cwd=harness.ROOT, check=True)
        with open(args.out) as f:
            fig = json.load(f)["figures"][NAME]
    else:
        fig = run(cfg, None)
        with open(args.out, "w") as f:
            json.dump(fig, f, indent=1)
    if fig.get("value") is not None:
        print("\n".join(markdown(dict(fig, plot="(not drawn)"))))
    return 0 if fig.get("value") is not None else 1


if __name__ == "__main__":
    import sys
    sys.exit(main())
