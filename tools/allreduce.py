"""Measure Horovod's allreduce on your own cluster, at a model's gradient sizes, and predict
how well training scales there.

    mpirun -np 16 --hostfile H python -m tools.allreduce --arch resnet18
    horovodrun -np 16 -H node1:8,node2:8 python -m tools.allreduce --arch resnet18
    srun --mpi=pmix python -m tools.allreduce --arch resnet18

Every process allreduces float32 tensors of sizes from a few KB up to all of the model's
gradients, most of them in the top decade, as the trainer would (GPUs with NCCL where there are
GPUs, else the CPU), and takes the median time of each size. A line through them, time = latency
+ 2 (N - 1) / N x bytes / bandwidth, gives the network's bandwidth (the median slope between
pairs of the largest sizes, with their spread: tools/linkfit.py) and per-message latency (from
the smallest) as one ring allreduce sees them; where the model's largest message is too small to
show the link, it says so instead of giving a rate. Where the job spans 4 or more hosts (or runs 4 or
more processes on one), the same is timed on the rings of its first 2, 4, 8, ... hosts, each a
Horovod process set, and the ring's stretch per doubling of N is fitted over them (the scaling
model's spread). Every process then times plain training steps for --seconds (rank 0's are kept:
their spread is what a step waits for in the slowest of N ranks) and its backward alone and
beside an allreduce of the gradients (what a collective takes from compute). Where every host
runs the same number (2 or more) of processes, a node's own ring is timed too, and the
hierarchical allreduce of all the gradients beside the flat ring's (the steps of
HOROVOD_HIERARCHICAL_ALLREDUCE, made of Horovod's collectives over process sets: see
hierarchical). Rank 0 times
Horovod's host cost of one allreduce request (in a process set of its own: no wire), profiles
the model's layers (tools/layer_profile.py: when in the backward pass each gradient is ready)
and prints, in a few lines, the efficiency the scaling model (tools/scaling_model.py) predicts for a training run at
this N with each flag set: the fraction of N times one process's images/s.
`--json FILE` also writes the figures, which `python -m tools.predict --from FILE` turns into a
prediction for another N, term by term. Horovod starts with the trainer's settings on CUDA
(training/ports/hvd_port.py) and dynamic process sets.
"""
import argparse
import json
import math
import os
import socket
import statistics
import sys
import time

import torch

import models
from tools import layer_profile, linkfit, scaling_model
from training.ports import hvd_port


def time_allreduce(hvd, nbytes, device, repeats, process_set=None):
    """The seconds of each of `repeats` allreduces of nbytes of float32 among the ranks of
    `process_set` (default: all), each the slowest rank's: a collective lasts as long as its
    slowest rank's. The fit takes their median. Called by the set's ranks alone."""
    ps = process_set or hvd.global_process_set
    t = torch.ones(nbytes // 4, device=device)
    times = []
    for i in range(repeats + 1):  # the first one is a warm-up (buffers, connections)
        hvd.barrier(process_set=ps)
        t0 = time.perf_counter()
        _wait(hvd, hvd.allreduce_async(t, op=hvd.Sum, name=f"probe.{ps.size()}.{nbytes}", process_set=ps))
        _sync(device)
        if i:
            times.append(time.perf_counter() - t0)
    return hvd.allreduce(torch.tensor(times, dtype=torch.float64), op=hvd.Max,
                         name=f"probe.{ps.size()}.{nbytes}.max", process_set=ps).tolist()


def _wait(hvd, handle):
    """The handle's result. Not hvd.synchronize alone: its wait spins on the CPU, and where a
    host has fewer cores than busy threads it takes the time Horovod's own thread needs to move
    the bytes."""
    while not hvd.poll(handle):
        time.sleep(5e-5)
    return hvd.synchronize(handle)


def _slowest(hvd, seconds, name, process_set=None):
    """The largest of the ranks' seconds: a collective lasts as long as its slowest rank's."""
    return float(hvd.allreduce(torch.tensor([seconds]), op=hvd.Max, name=name,
                               process_set=process_set or hvd.global_process_set))


def node_sets(hvd, hosts):
    """(this process's node, its cross-node set), the process sets of the hierarchical
    allreduce: the processes of each host, and the processes of the same place on every host.
    None unless the job spans 2 or more hosts of the same number (2 or more) of processes.
    Made on every rank alike (adding a process set is a collective); the cross-node sets first,
    so that a cycle of Horovod's thread, which takes up the sets in the order they were made,
    reaches the node sets last (tools/scaling_model.py: the composed hierarchical allreduce)."""
    units = ring_units(hosts)
    if len(units) < 2 or len({len(u) for u in units}) > 1 or len(units[0]) < 2:
        return None
    me = hvd.rank()
    crosses = [(hvd.add_process_set([u[i] for u in units]), me in [u[i] for u in units]) for i in range(len(units[0]))]
    nodes = [(hvd.add_process_set(u), me in u) for u in units]
    return next(ps for ps, mine in nodes if mine), next(ps for ps, mine in crosses if mine)


def hierarchical(hvd, t, node, cross, wait=None, name="probe.hier"):
    """The sum of `t` over every process: the steps of HOROVOD_HIERARCHICAL_ALLREDUCE made of
    Horovod's collectives over the node sets (gloo has no hierarchical path of its own). Inside
    the node an allreduce, of which each process keeps its share (where
    HOROVOD_HIERARCHICAL_ALLREDUCE reduce-scatters: Horovod 0.28.1's reducescatter over gloo
    returned wrong sums in some calls), then an allreduce of each share across the nodes, an
    allgather inside the node. `wait(handle)` waits for each (by default _wait)."""
    wait = wait or (lambda handle: _wait(hvd, handle))
    whole = wait(hvd.allreduce_async(t, op=hvd.Sum, name=f"{name}.node", process_set=node))
    share = whole.chunk(node.size())[node.rank()]
    share = wait(hvd.allreduce_async(share, op=hvd.Sum, name=f"{name}.cross", process_set=cross))
    return wait(hvd.allgather_async(share, name=f"{name}.gather", process_set=node))


def time_hierarchical(hvd, nbytes, device, repeats, node, cross):
    """The median of `repeats` hierarchical allreduces (see hierarchical) of nbytes of float32, in
    seconds, the slowest rank's, on every rank."""
    t = torch.ones(nbytes // 4, device=device)
    times = []
    for i in range(repeats + 1):
        hvd.barrier()
        t0 = time.perf_counter()
        out = hierarchical(hvd, t, node, cross)
        _sync(device)
        if i:
            times.append(time.perf_counter() - t0)
        if out.shape != t.shape or not bool((out == hvd.size()).all()):
            raise RuntimeError("the hierarchical allreduce's steps did not sum the ones of every process")
    return _slowest(hvd, statistics.median(times), "probe.hier.max")


def ring_units(hosts):
    """The units whose rings the spread is measured over, each a list of ranks: the hosts, where
    the job spans several (a node's link is what its ring crosses), else the processes."""
    order = list(dict.fromkeys(hosts))
    if len(order) > 1:
        return [[r for r, h in enumerate(hosts) if h == host] for host in order]
    return [[r] for r in range(len(hosts))]


def smaller_rings(hvd, hosts):
    """[(processes, process set)] of the rings of the first 2, 4, 8, ... units, smaller than the
    whole job's; made on every rank alike (adding a process set is a collective)."""
    units, out, k = ring_units(hosts), [], 2
    while k < len(units):
        out.append(hvd.add_process_set(sorted(r for u in units[:k] for r in u)))
        k *= 2
    return out


def fit_spread(rings):
    """The ring's stretch per doubling of N (scaling_model's spread), from [(n, bandwidth bps)] at
    two or more sizes of N: the wire time at N is stretched by 1 + spread x log2(N / 2), so the
    bandwidth seen at N is the bandwidth at 2 over that. The median of the smallest ring against
    each larger one; None with one size. A negative fit (noise on a flat ring) is 0."""
    rings = sorted(rings)
    if len(rings) < 2:
        return None
    (n0, b0), fits = rings[0], []
    for n, b in rings[1:]:
        r, a, c = b0 / b, math.log2(n0 / 2), math.log2(n / 2)
        fits.append((r - 1) / (c - r * a))
    return max(0.0, statistics.median(fits))


def step_times(model, x, y, device, steps=None, seconds=None):
    """Seconds of each plain training step (forward, backward, fused SGD step), after two warm-up
    steps: `steps` of them, or as many as `seconds` hold (at least 2). The distribution whose
    slowest of N a synchronous step waits for."""
    opt = torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.9, fused=True)
    out, i = [], 0
    while len(out) < (steps or 2) or (steps is None and sum(out) < seconds):
        _sync(device)
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        _sync(device)
        if i >= 2:
            out.append(time.perf_counter() - t0)
        i += 1
    return out


def compute_beside(hvd, model, x, y, device, nbytes, steps):
    """(forward and backward alone, the same while an allreduce of nbytes runs beside it on every
    rank), medians in seconds: what a collective's kernels or threads take from compute."""
    big = torch.ones(nbytes // 4, device=device)
    alone, beside = [], []
    for i in range(2 * steps + 2):
        hvd.barrier()
        handle = hvd.allreduce_async(big, op=hvd.Sum, name=f"probe.beside.{i}") if i % 2 else None
        t0 = time.perf_counter()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        _sync(device)
        took = time.perf_counter() - t0
        if handle is not None:
            hvd.synchronize(handle)
        if i >= 2:
            (beside if handle is not None else alone).append(took)
    return statistics.median(alone), statistics.median(beside)


def per_request(hvd, tensors, device, repeats, requests=200):
    """Horovod's host cost of one more allreduce request (its compression call, request, handle
    and wait), in seconds: at least `requests` gradient tensors of the model (its list, repeated)
    as one request each, against one request of all their bytes, on rank 0 in a process set of
    its own (no wire); the fastest of `repeats` each, over the extra requests. Every rank calls
    it; the others wait."""
    solo = hvd.global_process_set if hvd.size() == 1 else hvd.add_process_set([0])
    sizes_ = (tensors * math.ceil(requests / len(tensors)))[:max(requests, len(tensors))]
    each = [torch.ones(max(1, b // 4), device=device) for b in sizes_]
    flat = torch.ones(sum(len(e) for e in each), device=device)
    cost = None
    if hvd.rank() == 0:
        def fastest(parts, tag):
            times = []
            for i in range(repeats + 1):
                t0 = time.perf_counter()
                handles = [hvd.allreduce_async(p, name=f"probe.req.{tag}.{j}", process_set=solo)
                           for j, p in enumerate(parts)]
                for h in handles:
                    hvd.synchronize(h)
                _sync(device)
                if i:
                    times.append(time.perf_counter() - t0)
            return min(times)
        cost = max(0.0, (fastest(each, "each") - fastest([flat], "flat")) / (len(each) - 1))
    hvd.barrier()
    return cost


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fit_line(n, points):
    """(latency s, bandwidth bits/s or None) of linkfit.fit over [(bytes, seconds or [seconds])]
    of an allreduce among n processes."""
    got = linkfit.fit(n, points)
    return got["latency_s"], got["bandwidth_bps"]


FLAG_SETS = [("default", {}), ("--fp16-allreduce", {"fp16": True}), ("--batches-per-allreduce 4", {"k": 4}),
             ("fusion off (HOROVOD_FUSION_THRESHOLD=0)", {"fusion": False}),
             ("--compile (hooks after the whole backward)", {"compiled": True})]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="resnet18", help="a model of models.MODELS (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=128, help="per process (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="allreduces timed per size (default: %(default)s)")
    p.add_argument("--seconds", type=float, default=5.0,
                   help="seconds of training steps timed for their spread, and as many beside an allreduce "
                        "(default: %(default)s; at least 2 steps each)")
    p.add_argument("--steps", type=int, help="time this many steps in each instead of --seconds")
    p.add_argument("--json", metavar="FILE", help="also write the figures to FILE (rank 0), for "
                   "python -m tools.predict --from FILE")
    args = p.parse_args(argv)
    if args.arch not in models.MODELS:
        p.error(f"unknown --arch {args.arch}; one of {', '.join(sorted(models.MODELS))}")
    import horovod.torch as hvd
    hvd_port.apply()  # the trainer's settings: on CUDA its cycle, on the CPU its polled waits
    hvd.init(process_sets="dynamic")  # the smaller rings and rank 0's own set are added below
    device = torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    n = hvd.size()
    hosts = hvd.allgather_object(socket.gethostname())
    model = models.get_model(args.arch, num_classes=10).to(device)
    tensors = [q.numel() * 4 for q in model.parameters() if q.requires_grad]
    total = sum(tensors)
    started = time.monotonic()

    def progress(what):  # one line a phase, as it starts: a slow link's probe takes minutes
        if hvd.rank() == 0:
            print(f"probe [{time.monotonic() - started:5.0f} s]: {what}", flush=True)
    progress(f"allreduce at {len(linkfit.sizes(total))} sizes, {4096 / 1e3:.0f} KB to {total / 1e6:.1f} MB, "
             f"{args.repeats} times each")
    repeats = [(b, time_allreduce(hvd, b, device, args.repeats)) for b in linkfit.sizes(total)]
    measured = [(b, statistics.median(ts)) for b, ts in repeats]
    link = linkfit.fit(n, repeats) if n > 1 else dict(latency_s=0.0, bandwidth_bps=math.inf, reason=None, note=None)
    latency, bandwidth = link["latency_s"], link["bandwidth_bps"]
    rings = [{"n": n, "bandwidth_bps": bandwidth, "latency_s": latency}] if n > 1 and bandwidth else []
    smaller = smaller_rings(hvd, hosts)
    if smaller:
        progress(f"the rings of {', '.join(str(ps.size()) for ps in smaller)} processes")
    for ps in smaller:
        if ps.included():
            lat, bw = fit_line(ps.size(), [(b, time_allreduce(hvd, b, device, args.repeats, ps))
                                           for b in linkfit.sizes(total, below=1, top=4)])
            if hvd.rank() == 0 and bw:
                rings.append({"n": ps.size(), "bandwidth_bps": bw, "latency_s": lat})
        hvd.barrier()
    spread = fit_spread([(r["n"], r["bandwidth_bps"]) for r in rings])
    node, hierarchical, sets = None, None, node_sets(hvd, hosts)
    if sets:  # the node's own ring, and the hierarchical allreduce of all the gradients
        progress("a node's ring, and the hierarchical allreduce")
        got = linkfit.fit(sets[0].size(), [(b, time_allreduce(hvd, b, device, args.repeats, sets[0]))
                                           for b in linkfit.sizes(total, below=1, top=4)])
        # A node's fast link may not show in the model's sizes: what they do show is a floor.
        node = {"processes": sets[0].size(), "bandwidth_bps": got["bandwidth_bps"] or got["at_least_bps"],
                "latency_s": got["latency_s"], "bandwidth_reason": got["reason"]}
        seconds = time_hierarchical(hvd, measured[-1][0], device, args.repeats, *sets)
        hierarchical = {"nodes": len(set(hosts)), "bytes": measured[-1][0], "seconds": seconds,
                        "flat_seconds": measured[-1][1]}
    x = torch.randn(args.batch_size, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (args.batch_size,), device=device)
    progress(f"training steps ({args.steps} steps)" if args.steps else f"training steps ({args.seconds:g} s)")
    steps = step_times(model, x, y, device, args.steps, args.seconds)
    # Every rank runs as many backward passes beside an allreduce: the slowest's step sets how many fit.
    step_s = _slowest(hvd, statistics.median(steps), "probe.step.max")
    pairs = args.steps or max(2, int(args.seconds / (2 * step_s + measured[-1][1])))
    progress(f"the backward alone and beside an allreduce ({pairs} of each)")
    alone, beside = compute_beside(hvd, model, x, y, device, total, pairs)
    progress("a request's host cost, and the model's layers")
    request_s = per_request(hvd, tensors, device, args.repeats)
    if hvd.rank() != 0:
        return 0
    profile = layer_profile.measure(args.arch, args.batch_size, device=device,
                                    steps=5 if args.steps else max(2, min(5, int(args.seconds / step_s))))
    compute_s, backward_s = profile["step_s"], profile["backward_s"]
    where = f"{device.type}, {n} processes on {len(set(hosts))} host(s)"
    span = f"{len(measured)} sizes, {measured[0][0] / 1e3:.0f} KB to {measured[-1][0] / 1e6:.1f} MB"
    if bandwidth:
        low, high = link.get("range_bps") or (bandwidth, bandwidth)
        print(f"allreduce ({where}): bandwidth {bandwidth / 1e6:.1f} Mbit/s ({low / 1e6:.1f} to {high / 1e6:.1f} "
              f"between pairs of the largest {link.get('sizes', 0)} sizes), latency {latency * 1e3:.2f} ms per "
              f"message (measured at {span})")
    else:
        print(f"allreduce ({where}): no bandwidth: {link['reason']} (measured at {span}); run it with a larger "
              "--arch, or give tools.predict the link with --link-gbps")
    if link["note"]:
        print(f"allreduce: {link['note']}")
    print("the ring's stretch per doubling of N: " + (f"{spread:.3f} (rings of " + ", ".join(
        f"{r['n']}" for r in sorted(rings, key=lambda r: r["n"])) + " processes)" if spread is not None else
        "not measured (needs rings of two sizes: 4 or more hosts, or 4 or more processes on one host)"))
    if hierarchical and bandwidth:
        h, rate = hierarchical, bandwidth * (1 + (spread or 0.0) * math.log2(n / 2))
        per_node = node["processes"]
        # The model's steps, and the node's allreduce where a reduce-scatter would send half its bytes.
        h["predicted_s"] = scaling_model.message_s(n, h["bytes"], rate, (1.0, latency, spread or 0.0),
                                                   nodes=h["nodes"], intra_bps=node["bandwidth_bps"],
                                                   intra_latency_s=node["latency_s"]) \
            + (per_node - 1) / per_node * h["bytes"] * 8 / node["bandwidth_bps"]
        print(f"hierarchical allreduce ({h['nodes']} nodes of {node['processes']}: an allreduce inside each, a "
              f"ring of nodes, an allgather): {h['seconds'] * 1e3:.0f} ms for {h['bytes'] / 1e6:.1f} MB against the "
              f"flat ring's {h['flat_seconds'] * 1e3:.0f} ms (the scaling model: {h['predicted_s'] * 1e3:.0f} ms); "
              f"a node's ring: {node['bandwidth_bps'] / 1e6:.1f} Mbit/s"
              + (" or more" if node["bandwidth_reason"] else "") + f", {node['latency_s'] * 1e3:.2f} ms per message")
    print(f"{args.arch}: {len(tensors)} gradient tensors, {total / 1e6:.1f} MB in fp32; a step of batch "
          f"{args.batch_size} computes in {compute_s * 1e3:.0f} ms here (backward {backward_s * 1e3:.0f} ms); "
          f"{len(steps)} steps: median {statistics.median(steps) * 1e3:.1f} ms, slowest {max(steps) * 1e3:.1f} ms; "
          f"beside an allreduce x{beside / alone:.2f}; {request_s * 1e6:.0f} us of host time a request")
    predicted = {}
    if bandwidth:
        print(f"predicted efficiency at np={n} (scaling model, Horovod; 1.0 = N times one process's images/s):")
    # The fitted bandwidth is what a collective achieves: efficiency 1 on top of it.
    params = (1.0, latency)
    for name, flags in FLAG_SETS if bandwidth else []:
        point = dict(n=n, tensors=tensors, rate_bps=bandwidth, compute_s=compute_s, backward_s=backward_s,
                     ready=layer_profile.ready_times(profile), **flags)
        predicted[name] = scaling_model.efficiency(point, params)
        exposed = scaling_model.step_s(point, params) - point.get("k", 1) * compute_s
        print(f"  {name:<44} {predicted[name]:6.1%}   (allreduce not hidden: {exposed * 1e3:.0f} ms a step)")
    progress("done")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n": n, "device": device.type, "hosts": len(set(hosts)), "bandwidth_bps": bandwidth,
                       "bandwidth_range_bps": link.get("range_bps"), "bandwidth_sizes": link.get("sizes"),
                       "bandwidth_reason": link["reason"], "bandwidth_note": link["note"],
                       "latency_s": latency, "measured": measured, "repeats_s": repeats, "rings": rings,
                       "spread": spread, "node": node, "hierarchical": hierarchical,
                       "arch": args.arch, "batch": args.batch_size, "tensors": len(tensors), "tensor_bytes": tensors,
                       "bytes": total, "compute_s": compute_s, "backward_s": backward_s, "profile": profile,
                       "step_times_s": steps, "backward_alone_s": alone, "backward_beside_allreduce_s": beside,
                       "request_s": request_s, "cycle_s": float(os.environ.get("HOROVOD_CYCLE_TIME", 1)) / 1e3,
                       "predicted_efficiency": predicted}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
