"""Measure Horovod's allreduce on your own cluster, at a model's gradient sizes, and predict
how well training scales there.

    mpirun -np 16 --hostfile H python -m tools.allreduce --arch resnet18
    horovodrun -np 16 -H node1:8,node2:8 python -m tools.allreduce --arch resnet18
    srun --mpi=pmix python -m tools.allreduce --arch resnet18

Every process allreduces float32 tensors of sizes from a few KB up to all of the model's
gradients, as the trainer would (GPUs with NCCL where there are GPUs, else the CPU), and takes
the fastest time of each size. A line through them, time = latency + 2 (N - 1) / N x bytes /
bandwidth, gives the network's bandwidth (from the largest sizes) and per-message latency (from
the smallest) as one ring allreduce sees them. Rank 0 then profiles the model's layers on its
own device (tools/layer_profile.py: the step's compute, and when in the backward pass each
gradient is ready) and prints, in a few lines, the efficiency the scaling model
(tools/scaling_model.py) predicts for a training run at this N with each flag set: the
fraction of N times one process's images/s.
`--json FILE` also writes the figures.
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch

import models
from tools import layer_profile, scaling_model


def sizes(total_bytes, smallest=4096, steps=10):
    """Message sizes in bytes, a geometric series from `smallest` to the model's total."""
    ratio = (total_bytes / smallest) ** (1 / (steps - 1))
    return sorted({int(smallest * ratio ** i) // 4 * 4 for i in range(steps)} | {total_bytes // 4 * 4})


def time_allreduce(hvd, nbytes, device, repeats):
    """The fastest of `repeats` allreduces of nbytes of float32, in seconds: the network's time
    (other work on a shared host only ever adds to it, and a median still carries that)."""
    t = torch.ones(nbytes // 4, device=device)
    times = []
    for i in range(repeats + 1):  # the first one is a warm-up (buffers, connections)
        hvd.barrier()
        t0 = time.perf_counter()
        handle = hvd.allreduce_async(t, op=hvd.Sum, name=f"probe.{nbytes}")
        # Not hvd.allreduce: its wait spins on the CPU, and where a host has fewer cores than
        # busy threads it takes the time Horovod's own thread needs to move the bytes.
        while not hvd.poll(handle):
            time.sleep(5e-5)
        hvd.synchronize(handle)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - t0)
    # The slowest rank's time is the collective's.
    return max(hvd.allgather_object(min(times)))


def fit_line(n, points):
    """(latency s, bandwidth bits/s) from [(bytes, seconds)] for time = latency + 2 (N - 1) / N x
    bytes / bandwidth. The bandwidth is the median of the slopes from the smallest size to each
    of the three largest, the latency what the smallest size's time leaves after it. The large
    sizes are those fused gradients have; the median is not moved by one slow size, nor by
    links that pass a small message at once and only then pace (a switch's buffer, a token
    bucket), which bend the line in between (a least-squares line through them can fit a
    negative latency)."""
    points = sorted((2 * (n - 1) / n * b * 8, s) for b, s in points)
    (x0, t0), large = points[0], points[1:][-3:]
    rates = [(x - x0) / (t - t0) for x, t in large if t > t0]
    if not rates:
        return t0, math.inf
    bandwidth = statistics.median(rates)
    return max(t0 - x0 / bandwidth, 0.0), bandwidth


FLAG_SETS = [("default", {}), ("--fp16-allreduce", {"fp16": True}), ("--batches-per-allreduce 4", {"k": 4}),
             ("fusion off (HOROVOD_FUSION_THRESHOLD=0)", {"fusion": False}),
             ("--compile (hooks after the whole backward)", {"compiled": True})]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="resnet18", help="a model of models.MODELS (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=128, help="per process (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="allreduces timed per size (default: %(default)s)")
    p.add_argument("--json", metavar="FILE", help="also write the figures to FILE (rank 0)")
    args = p.parse_args(argv)
    if args.arch not in models.MODELS:
        p.error(f"unknown --arch {args.arch}; one of {', '.join(sorted(models.MODELS))}")
    import horovod.torch as hvd
    hvd.init()
    device = torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    n = hvd.size()
    model = models.get_model(args.arch, num_classes=10)
    tensors = [q.numel() * 4 for q in model.parameters() if q.requires_grad]
    total = sum(tensors)
    measured = [(b, time_allreduce(hvd, b, device, args.repeats)) for b in sizes(total)]
    if n > 1:
        latency, bandwidth = fit_line(n, measured)
    else:
        latency, bandwidth = 0.0, math.inf
    profile = layer_profile.measure(args.arch, args.batch_size, device=device)
    compute_s, backward_s = profile["step_s"], profile["backward_s"]
    if hvd.rank() != 0:
        return 0
    where = f"{device.type}, {n} processes on {hvd.cross_size()} host(s)"
    print(f"allreduce ({where}): bandwidth {bandwidth / 1e6:.1f} Mbit/s, latency {latency * 1e3:.2f} ms "
          f"per message (fitted over {len(measured)} sizes, {measured[0][0] / 1e3:.0f} KB to "
          f"{measured[-1][0] / 1e6:.1f} MB)")
    print(f"{args.arch}: {len(tensors)} gradient tensors, {total / 1e6:.1f} MB in fp32; a step of batch "
          f"{args.batch_size} computes in {compute_s * 1e3:.0f} ms here (backward {backward_s * 1e3:.0f} ms)")
    print(f"predicted efficiency at np={n} (scaling model, Horovod; 1.0 = N times one process's images/s):")
    # The fitted bandwidth is what a collective achieves: efficiency 1 on top of it.
    params = (1.0, latency)
    predicted = {}
    for name, flags in FLAG_SETS:
        point = dict(n=n, tensors=tensors, rate_bps=bandwidth, compute_s=compute_s, backward_s=backward_s,
                     ready=layer_profile.ready_times(profile), **flags)
        predicted[name] = scaling_model.efficiency(point, params)
        exposed = scaling_model.step_s(point, params) - point.get("k", 1) * compute_s
        print(f"  {name:<44} {predicted[name]:6.1%}   (allreduce not hidden: {exposed * 1e3:.0f} ms a step)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n": n, "device": device.type, "bandwidth_bps": bandwidth, "latency_s": latency,
                       "measured": measured, "arch": args.arch, "tensors": len(tensors), "bytes": total,
                       "compute_s": compute_s, "backward_s": backward_s, "profile": profile,
                       "predicted_efficiency": predicted}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
