"""Figure horovod_hook_overhead_ms: what Horovod's gradient hooks add to a training step, in
milliseconds, at np=1 on a model whose compute is tiny, measured beside main.py's step.

Every job of two or more processes runs DistributedOptimizer's hooks: each gradient, as backward
makes it, is handed to Horovod (allreduce_async_: a handle, a name, an entry in its queue),
and step() waits for each handle in turn (synchronize) before the update. At np=1 the hooks are
off unless forced; benchmarks/diagnostics/hooks_on.py forces them without Horovod's elastic mode,
so what is timed is that per-tensor machinery alone, with no network and no other rank. LeNet at
batch 16 (10 gradient tensors, a step of a few ms) keeps the compute small beside it.

Sides, alternating, each repeat once: main.py; main_horovod.py with the hooks (the headline:
its step minus main.py's); and beside it the hooks with the levers that can change this cost
without touching Horovod: `--allreduce-groups 1` (one grouped request per step instead of one
per tensor), a 0.1 ms cycle (HOROVOD_CYCLE_TIME), and Horovod's elastic mode on
(HOROVOD_ELASTIC=1 read at init, as main_elastic.py runs). The step is the mean over the timed
epochs (metrics.csv's epoch_time_s over the steps they hold); the headline is the median of the
per-repeat differences. Also recorded: the same per gradient tensor, the figure to hold against
a model's tensor count (ResNet-18 has 62).
"""
import math

from benchmarks import harness, trainer_runs

NAME = "horovod_hook_overhead_ms"
GOAL = ("<=", 0.25)
DESCRIPTION = "ms that Horovod's gradient hooks add to a step at np=1 (LeNet, batch 16), beside main.py's step"
LENET_TENSORS = 10
# name: (trainer_runs kind, extra environment, extra flags)
SIDES = {
    "main.py": ("main", {}, []),
    "hooks": ("hvd-hooks", {}, []),
    "hooks, --allreduce-groups 1": ("hvd-hooks", {}, ["--allreduce-groups", "1"]),
    "hooks, 0.1 ms cycle": ("hvd-hooks", {"HOROVOD_CYCLE_TIME": "0.1"}, []),
    "hooks, elastic mode": ("hvd", {"HOROVOD_ELASTIC": "1"}, []),
}
FULL = dict(trainer_runs.FULL, train_batch=16, train_epochs=4, hooks_repeats=3, hooks_sides=list(SIDES))
QUICK = dict(trainer_runs.QUICK, train_batch=16, hooks_repeats=1, hooks_sides=["main.py", "hooks"])


def run(cfg, ctx):
    runs = trainer_runs.shared(cfg, ctx)
    sides, repeats = cfg["hooks_sides"], cfg["hooks_repeats"]
    steps = (cfg["train_epochs"] - cfg["skip_epochs"]) * math.ceil(cfg["train_size"] / cfg["train_batch"])
    step_ms = {s: [] for s in sides}
    commands = {}
    for r, order in enumerate(harness.alternating(sides, repeats)):
        for side in order:
            kind, env, flags = SIDES[side]
            res = runs.run(kind, env_extra=env, flags=flags)
            assert res["world_size"] == 1
            step_ms[side].append(1e3 * res["train_s"] / steps)
            commands[side] = res["command"]
        harness.log(f"hooks repeat {r + 1}/{repeats}: " +
                    ", ".join(f"{s} {step_ms[s][-1]:.3f} ms" for s in sides) + " per step")
    added = {s: [h - m for h, m in zip(v, step_ms["main.py"])] for s, v in step_ms.items() if s != "main.py"}
    value = harness.median(added["hooks"])
    return {"value": value, "repeats": added["hooks"],
            "per_tensor_ms": value / LENET_TENSORS,
            "main_step_ms": harness.median(step_ms["main.py"]),
            "sides": {s: {"step_ms": v, "median": harness.median(v),
                          "added_ms": harness.median(added[s]) if s in added else 0.0}
                      for s, v in step_ms.items()},
            "setup": {"timed": f"{steps} steps: epochs {cfg['skip_epochs'] + 1}..{cfg['train_epochs']} of "
                               f"{cfg['train_size']} images at batch {cfg['train_batch']}, one process, "
                               "every usable core",
                      "sides": {s: SIDES[s] for s in sides}, "commands": commands}}


def markdown(fig):
    st = fig["setup"]
    L = [f"Timed: {st['timed']}; every side once per repeat, alternating. main.py's step: "
         f"{fig['main_step_ms']:.3f} ms. Per gradient tensor: {fig['per_tensor_ms'] * 1e3:.0f} us "
         f"(LeNet has {LENET_TENSORS}).", "",
         "| side | ms per step, per repeat | median | added to main.py's step (median) |", "|---|---|---|---|"]
    for s, v in fig["sides"].items():
        L.append(f"| {s} | {harness.fmt_list(v['step_ms'])} | {v['median']:.3f} | {v['added_ms']:+.3f} |")
    L.append("")
    L += harness.command_lines(st["commands"])
    return L
