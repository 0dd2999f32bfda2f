"""Figure layout_design_cost: the training step of the chosen channels_last design for Horovod
over the alternative design, with DistributedOptimizer's gradient hooks on.

Horovod's collectives refuse channels_last tensors (layout.py). Two designs work:
  ours:        weights, gradients and input channels_last; the gradient allreduce takes
               each gradient as its contiguous NHWC view (layout.GradLayout, no copy)
  alternative: weights (so gradients) contiguous, input channels_last
and, for scale, "all contiguous". All three run in one process at np=1 with
HOROVOD_ELASTIC=1, which makes DistributedOptimizer register its hooks and allreduce every
gradient as it does at np >= 2. The sides alternate step block by step block. Below 1 the
chosen design is faster. Also recorded: GradLayout's own compress + decompress time per
step, over all the model's gradients.
"""
import json
import subprocess
import sys

from benchmarks import harness, trainer_runs

NAME = "layout_design_cost"
GOAL = ("<=", 1.02)
DESCRIPTION = "step time, channels_last + GradLayout over contiguous weights + channels_last input"
FULL = dict(layout_arch="resnet18", layout_batch=32, layout_steps=4, layout_repeats=5)
QUICK = dict(layout_arch="lenet", layout_batch=16, layout_steps=2, layout_repeats=1)
SIDES = {"ours": "channels_last weights and input, GradLayout",
         "alternative": "contiguous weights, channels_last input",
         "contiguous": "all contiguous"}

PROBE = r"""
import json, sys, time
import torch
import horovod.torch as hvd
from training.base import layout
from training.run import cli, devices
import utils
arch, batch, steps, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
hvd.init()
device = devices.pick_device()
devices.share_cores(device)
CL = torch.channels_last

def side(weights_cl):
    args = cli.parse_args(cli.build_parser(""), ["--arch", arch, "--no-channels-last"])
    model = utils.build_model(args, device)
    opt = hvd.DistributedOptimizer(utils.make_optimizer(model, args), named_parameters=model.named_parameters(),
                                   compression=layout.GradLayout(hvd.Compression.none))
    for g in opt.param_groups:
        g["lr"] = 0.01
    if weights_cl:
        layout.channels_last(model, opt)
    return model, opt

models = {"ours": side(True), "alternative": side(False), "contiguous": side(False)}
x = torch.randn(batch, 3, 32, 32, device=device)
inputs = {"ours": x.contiguous(memory_format=CL), "alternative": x.contiguous(memory_format=CL),
          "contiguous": x.contiguous()}
y = torch.randint(0, 10, (batch,), device=device)

def block(name):
    model, opt = models[name]
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs[name]), y).backward()
        opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps

for name in models:  # warm-up: allocators, oneDNN/cuDNN kernel choice
    block(name)
order = list(models)
times = {k: [] for k in models}
for r in range(repeats):
    for name in (order if r % 2 == 0 else order[::-1]):
        times[name].append(block(name))
grads = [p.grad for p in models["ours"][0].parameters()]
comp = layout.GradLayout(hvd.Compression.none)
t0 = time.perf_counter()
for _ in range(100):
    for g in grads:
        comp.decompress(*comp.compress(g))
per_step_us = (time.perf_counter() - t0) / 100 * 1e6
print(json.dumps({"times": times, "grad_layout_us_per_step": per_step_us, "device": str(device),
                  "threads": torch.get_num_threads(), "params": len(grads)}))
"""


def run(cfg, ctx):
    argv = [cfg["layout_arch"], cfg["layout_batch"], cfg["layout_steps"], cfg["layout_repeats"]]
    r = subprocess.run([sys.executable, "-c", PROBE, *map(str, argv)], cwd=harness.ROOT,
                       env=trainer_runs.env({"HOROVOD_ELASTIC": "1"}), capture_output=True, text=True,
                       timeout=900, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise RuntimeError(f"layout probe failed: {r.stderr[-3000:]}")
    got = json.loads(r.stdout.strip().splitlines()[-1])
    t = got["times"]
    ratios = [a / b for a, b in zip(t["ours"], t["alternative"])]
    harness.log(f"layout: ours/alternative per repeat {', '.join(f'{v:.3f}' for v in ratios)}; "
                f"GradLayout {got['grad_layout_us_per_step']:.0f} us per step")
    return {
        "value": harness.median(ratios), "repeats": ratios,
        "ratio_of_medians": harness.median(t["ours"]) / harness.median(t["alternative"]),
        "sides": harness.side_medians({k: [v * 1e3 for v in vs] for k, vs in t.items()}, "ms_per_step",
                                      SIDES),
        "contiguous_over_ours": harness.median(t["contiguous"]) / harness.median(t["ours"]),
        "grad_layout_us_per_step": got["grad_layout_us_per_step"],
        "setup": {"arch": cfg["layout_arch"], "batch_size": cfg["layout_batch"],
                  "steps_per_block": cfg["layout_steps"], "device": got["device"],
                  "threads": got["threads"], "gradients": got["params"],
                  "how": "one process, hvd.init() at np=1 with HOROVOD_ELASTIC=1 (hooks on), "
                         "SGD momentum 0.9, fixed random input; blocks alternate ABC/CBA"},
    }


def markdown(fig):
    st = fig["setup"]
    lines = [f"{st['arch']}, batch {st['batch_size']}, on `{st['device']}` with {st['threads']} threads; "
             f"{st['how']}; {st['steps_per_block']} steps per block.", ""]
    lines += harness.sides_table(fig["sides"], "ms_per_step", "ms per step", ".1f")
    lines += [f"All contiguous over ours: {fig['contiguous_over_ours']:.3f}. GradLayout's compress and "
              f"decompress of all {st['gradients']} gradients: {fig['grad_layout_us_per_step']:.0f} µs "
              "per step (views only, no copy).", ""]
    return lines
