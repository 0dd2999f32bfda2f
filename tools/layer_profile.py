"""A model's per-layer profile: how long each layer's forward pass takes, and when in the
backward pass each layer's gradients become ready, measured on a device; and that profile
scaled to another device's step time.

    python -m tools.layer_profile --arch resnet18 --batch 16 --json prof.json
    python -m tools.layer_profile --arch resnet18 --batch 128 --step-ms 2.70   # an H100's step, split

A layer is a module with parameters of its own (a convolution, a BatchNorm, a linear layer).
Its forward time runs from its forward hook's start to the next layer's (the functions between
layers, ReLU, pooling, the residual sums, count with the layer before them; the last layer's
runs to the loss). In the backward pass every parameter's gradient hook
(register_post_accumulate_grad_hook) records when that gradient is ready; a layer is ready when
its last parameter is, and its backward time is the time since the layer ready before it (the
first includes the loss's backward). What is left after the last layer is ready is the tail.
The optimizer step is the trainer's fused SGD. Each figure is the median over the timed steps.

`scaled` turns a profile into another device's: every time multiplied by one factor, so that
forward, backward and optimizer step add up to the step time given. It keeps this device's
proportions, which are not another device's: an H100 runs small layers relatively slower
(launch-bound), and a per-layer profile measured there would replace it.
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import models
import utils


def leaf_layers(model):
    """[(module name, module, [(parameter name, parameter)])] of the modules that hold
    parameters of their own, in registration order."""
    out = []
    for name, module in model.named_modules():
        own = [(f"{name}.{p}" if name else p, q) for p, q in module.named_parameters(recurse=False)
               if q.requires_grad]
        if own:
            out.append((name, module, own))
    return out


def measure(arch, batch, steps=5, device=None):
    """The profile of `arch` at `batch` on `device` (default: the CPU, with torch's threads as
    set): a dict with the layers in the order the backward pass reaches them last-first (the
    order a chain of them must run forward to release gradients in the same order), each with
    its parameters' names and sizes, forward_s and backward_s; tail_s, optimizer_s, and the
    totals forward_s, backward_s, step_s."""
    device = device or torch.device("cpu")
    model = models.get_model(arch, num_classes=10).to(device)
    layers = leaf_layers(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.9, weight_decay=5e-4,
                          fused=True)
    x = torch.randn(batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    started, ready = {}, {}

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def on_forward(name):
        def hook(module, inputs):
            sync()
            started[name] = time.perf_counter()
        return hook

    def on_ready(name):
        def hook(param):
            sync()
            ready[name] = time.perf_counter()
        return hook

    handles = [m.register_forward_pre_hook(on_forward(n)) for n, m, _ in layers]
    handles += [p.register_post_accumulate_grad_hook(on_ready(pn)) for _, _, ps in layers for pn, p in ps]
    runs = []
    try:
        for i in range(steps + 2):  # two warm-up steps (allocations, algorithm choice)
            started.clear()
            ready.clear()
            opt.zero_grad()
            sync()
            t0 = time.perf_counter()
            loss = F.cross_entropy(model(x), y)
            sync()
            t1 = time.perf_counter()
            loss.backward()
            sync()
            t2 = time.perf_counter()
            opt.step()
            sync()
            t3 = time.perf_counter()
            if i >= 2:
                runs.append((dict(started), dict(ready), t0, t1, t2, t3))
    finally:
        for h in handles:
            h.remove()
    return summarize(arch, batch, device, layers, runs)


def summarize(arch, batch, device, layers, runs):
    """The per-step timestamps of `measure` as one profile of medians."""
    fwd, bwd, ready_at = {}, {}, {}
    for started, ready, _, t1, t2, _ in runs:
        order = sorted(started, key=started.get)  # forward execution order
        for a, b in zip(order, order[1:] + [None]):
            fwd.setdefault(a, []).append((started[b] if b else t1) - started[a])
        for name, _, params in layers:
            ready_at.setdefault(name, []).append(max(ready[p] for p, _ in params) - t1)
        bwd.setdefault("", []).append(t2 - t1)
    med = {name: statistics.median(v) for name, v in ready_at.items()}
    # Forward time before the first layer (none for these models) goes with the first one.
    first = min(runs[0][0], key=runs[0][0].get)
    head = statistics.median([started[first] - t0 for started, _, t0, *_ in runs])
    chain = sorted(layers, key=lambda layer: -med[layer[0]])  # the last ready first
    by_name, previous = {}, 0.0
    for name, _, params in reversed(chain):
        by_name[name] = {"name": name, "params": [p for p, _ in params],
                         "bytes": [q.numel() * q.element_size() for _, q in params],
                         "forward_s": statistics.median(fwd[name]) + (head if name == first else 0.0),
                         "backward_s": max(med[name] - previous, 0.0)}
        previous = max(previous, med[name])
    backward_s = statistics.median(bwd[""])
    optimizer_s = statistics.median([t3 - t2 for *_, t2, t3 in runs])
    out = {"arch": arch, "batch": batch, "device": str(device), "threads": torch.get_num_threads(),
           "steps": len(runs), "source": f"measured on {device_name(device)}",
           "layers": [by_name[name] for name, _, _ in chain],
           "tail_s": max(backward_s - previous, 0.0), "optimizer_s": optimizer_s}
    # The totals are the layers' sums, so that a profile and its layers always agree.
    out["forward_s"], out["backward_s"], _ = totals(out)
    out["step_s"] = out["forward_s"] + out["backward_s"] + optimizer_s
    return out


def device_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"this machine's CPU, {torch.get_num_threads()} thread(s)"


def totals(profile):
    """(forward_s, backward_s, optimizer_s) as the layers add them up."""
    forward = sum(layer["forward_s"] for layer in profile["layers"])
    backward = sum(layer["backward_s"] for layer in profile["layers"]) + profile["tail_s"]
    return forward, backward, profile["optimizer_s"]


def scaled(profile, step_s, source):
    """The profile with every time multiplied by one factor, so that forward, backward and the
    optimizer step add up to step_s; `source` says where step_s comes from."""
    forward, backward, optimizer = totals(profile)
    factor = step_s / (forward + backward + optimizer)
    return fitted(profile, forward * factor, backward * factor, optimizer * factor, source)


def fitted(profile, forward_s, backward_s, optimizer_s, source):
    """The profile with its layers' forward times scaled to add up to forward_s, their backward
    times (and the tail) to backward_s, and the optimizer step set to optimizer_s: a run's own
    measured phases, split over the layers in this profile's proportions."""
    forward, backward, _ = totals(profile)
    f, b = forward_s / forward, backward_s / backward
    layers = [dict(layer, forward_s=layer["forward_s"] * f, backward_s=layer["backward_s"] * b)
              for layer in profile["layers"]]
    out = dict(profile, layers=layers, tail_s=profile["tail_s"] * b, optimizer_s=optimizer_s,
               source=f"{source}, split by the proportions {profile['source']}")
    out["forward_s"], out["backward_s"], _ = totals(out)
    out["step_s"] = out["forward_s"] + out["backward_s"] + optimizer_s
    return out


def ready_times(profile, regions=False):
    """[(seconds after the backward pass starts, bytes)] of every gradient tensor, in the order
    they become ready: what the scaling model overlaps the allreduce with. `regions`: the model
    compiled block by block (utils.compiled_regions), each region's gradients ready together when
    its last layer's backward ends (region_ends)."""
    done = backward_done(profile)
    if regions:
        done = region_ends(profile, done)
    in_backward_order = zip(reversed(done), reversed(profile["layers"]))
    return [(t, b) for t, layer in sorted(in_backward_order, key=lambda x: x[0]) for b in layer["bytes"]]


def backward_done(profile):
    """When each layer (forward order) ends its backward, in seconds after the pass starts."""
    t, done = 0.0, []
    for layer in reversed(profile["layers"]):
        t += layer["backward_s"]
        done.append(t)
    return done[::-1]


def region_ends(profile, done):
    """Each layer's time in `done` put off to the end of its region (utils.regions), which
    utils.compiled_regions compiles as one graph, whose backward hands over all its gradients
    when it ends."""
    with torch.device("meta"):  # names only: no weights made
        names = [name for name, _ in utils.regions(models.get_model(profile["arch"], num_classes=10))]

    def region(param):
        return next((n for n in names if param.startswith(n + ".")), param)
    stage = [region(layer["params"][0]) for layer in profile["layers"]]
    end = {}
    for s, t in zip(stage, done):
        end[s] = max(end.get(s, 0.0), t)
    return [end[s] for s in stage]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="resnet18", help="a model of models.MODELS (default: %(default)s)")
    p.add_argument("--batch", type=int, default=128, help="images per step (default: %(default)s)")
    p.add_argument("--steps", type=int, default=5, help="timed steps, after 2 warm-up ones (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (default: %(default)s)")
    p.add_argument("--step-ms", type=float, default=None,
                   help="scale the profile to this step time (forward, backward, optimizer), e.g. a GPU's")
    p.add_argument("--json", metavar="FILE", help="write the profile to FILE")
    args = p.parse_args(argv)
    if args.arch not in models.MODELS:
        p.error(f"unknown --arch {args.arch}; one of {', '.join(sorted(models.MODELS))}")
    if args.batch < 1 or args.steps < 1 or args.threads < 1 or (args.step_ms is not None and args.step_ms <= 0):
        p.error("--batch, --steps, --threads and --step-ms must be positive")
    torch.set_num_threads(args.threads)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    prof = measure(args.arch, args.batch, args.steps, device)
    if args.step_ms:
        prof = scaled(prof, args.step_ms / 1e3, f"a step of {args.step_ms} ms (--step-ms)")
    print(f"{args.arch}, batch {args.batch}: forward {prof['forward_s'] * 1e3:.2f} ms, backward "
          f"{prof['backward_s'] * 1e3:.2f} ms, optimizer {prof['optimizer_s'] * 1e3:.2f} ms; "
          f"{len(prof['layers'])} layers ({prof['source']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(prof, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
