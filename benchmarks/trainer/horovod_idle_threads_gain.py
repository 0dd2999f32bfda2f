"""Figure horovod_idle_threads_gain: Horovod at np=2 with its threads in the cores' spare time
(the trainer's default, devices.share_cores) over the same with them at normal priority; beside
it, every other lever on Horovod's per-step cost against the defaults, in the same run.

Each repeat runs every setting once, in an order reversed every other repeat, on MobileNet
(batch 16, the steady-state settings of horovod_vs_ddp_np2) and on LeNet, with DDP as the
yardstick. The levers: DistributedOptimizer(groups=1), one grouped allreduce per step instead of
one per tensor (--allreduce-groups); a 5 ms cycle; HOROVOD_ENABLE_ASYNC_COMPLETION with a 0 ms
cycle (documented for GPUs); and the previous default, Horovod's threads at normal priority
(benchmarks.diagnostics.normal_priority). Every setting trains the same weights: the levers change when and
how gradients are reduced, not what is summed. `python -m benchmarks.diagnostics.horovod_knobs` runs more.
"""
from benchmarks import harness, trainer_runs
from benchmarks.trainer import horovod_vs_ddp_np2

NAME = "horovod_idle_threads_gain"
GOAL = (">=", 1.05)
DESCRIPTION = "Horovod np=2 images/s, its threads in the cores' spare time over normal priority (MobileNet)"
# name: (trainer_runs kind, extra environment, extra flags)
SETTINGS = {
    "defaults": ("hvd2", {}, []),
    "normal priority": ("hvd2-normal", {}, []),
    "groups 1": ("hvd2", {}, ["--allreduce-groups", "1"]),
    "groups 4": ("hvd2", {}, ["--allreduce-groups", "4"]),
    "cycle 5 ms": ("hvd2", {"HOROVOD_CYCLE_TIME": "5"}, []),
    "cycle 20 ms": ("hvd2", {"HOROVOD_CYCLE_TIME": "20"}, []),
    "async, cycle 0": ("hvd2", {"HOROVOD_ENABLE_ASYNC_COMPLETION": "1", "HOROVOD_CYCLE_TIME": "0"}, []),
    "no fusion": ("hvd2", {"HOROVOD_FUSION_THRESHOLD": "0"}, []),
    "no response cache": ("hvd2", {"HOROVOD_CACHE_CAPACITY": "0"}, []),
    "MPI controller": ("hvd2-mpi", {}, []),
    "DDP": ("ddp2", {}, []),
}
SIDES = ["defaults", "normal priority", "groups 1", "cycle 5 ms", "async, cycle 0", "DDP"]
FULL = dict(trainer_runs.FULL, levers_repeats=3, levers_sides=SIDES, levers_model=horovod_vs_ddp_np2.MODEL)
QUICK = dict(trainer_runs.QUICK, levers_repeats=1, levers_sides=["defaults", "normal priority"],
             levers_model=horovod_vs_ddp_np2.QUICK["hvd_ddp_model"])


def measure(runs, sides, repeats, label):
    """{side: [images/s per repeat]}, the sides alternating; and the last command of each."""
    got, commands = {s: [] for s in sides}, {}
    for r, order in enumerate(harness.alternating(sides, repeats)):
        for side in order:
            kind, env, flags = SETTINGS[side]
            res = runs.run(kind, env_extra=env, flags=flags)
            assert res["world_size"] == 2
            got[side].append(res["images_per_s"])
            commands[side] = res["command"]
        harness.log(f"levers {label} repeat {r + 1}/{repeats}: " +
                    ", ".join(f"{s} {got[s][-1]:.0f}" for s in sides) + " img/s")
    return got, commands


def table(got):
    """Per side: images/s per repeat, their median, and the median per-repeat ratio to the defaults."""
    return {side: {"images_per_s": v, "median": harness.median(v),
                   "vs_defaults": harness.median([x / d for x, d in zip(v, got["defaults"])])}
            for side, v in got.items()}


def run(cfg, ctx):
    heavy, light = trainer_runs.shared(cfg["levers_model"], ctx), trainer_runs.shared(cfg, ctx)
    sides, repeats = cfg["levers_sides"], cfg["levers_repeats"]
    mobilenet, commands = measure(heavy, sides, repeats, cfg["levers_model"]["arch"])
    lenet, _ = measure(light, sides, repeats, "lenet")
    gain = [d / n for d, n in zip(mobilenet["defaults"], mobilenet["normal priority"])]
    return {"value": harness.median(gain), "repeats": gain,
            "lenet": {"value": harness.median([d / n for d, n in zip(lenet["defaults"],
                                                                     lenet["normal priority"])])},
            "models": {cfg["levers_model"]["arch"]: table(mobilenet), "lenet": table(lenet)},
            "setup": {"model": cfg["levers_model"], "lenet": {k: cfg[k] for k in trainer_runs.FULL},
                      "settings": {s: SETTINGS[s] for s in sides}, "commands": commands}}


def markdown(fig):
    st = fig["setup"]
    L = [f"Every setting once per repeat, alternating; {st['model']['arch']} as in horovod_vs_ddp_np2, "
         f"LeNet as in scaling_efficiency_np2. Beside the headline, LeNet: {harness.fmt(fig['lenet']['value'])}.",
         "", "Settings (environment, trainer flags):", ""]
    L += [f"- {s}: `{kind}` {env or ''} {' '.join(flags)}".rstrip() for s, (kind, env, flags) in st["settings"].items()]
    L.append("")
    for arch, rows in fig["models"].items():
        L += [f"{arch}:", "", "| setting | images/s per repeat | median | over the defaults |", "|---|---|---|---|"]
        for side, row in rows.items():
            L.append(f"| {side} | {', '.join(f'{x:.0f}' for x in row['images_per_s'])} | {row['median']:.1f} "
                     f"| {row['vs_defaults']:.3f} |")
        L.append("")
    return L
