"""Predict a training job's step on your cluster, term by term, from what the allreduce probe
measured there (tools/allreduce.py --json).

    mpirun -np 16 --hostfile H python -m tools.allreduce --arch resnet18 --json probe.json
    python -m tools.predict --from probe.json --nodes 4 --gpus-per-node 8
    python -m tools.predict --from probe.json --nodes 4 --gpus-per-node 8 --compile --step-ms 2.7
    python -m tools.predict --link-gbps 100 --step-ms 6.39 --nodes 4 --gpus-per-node 8   # no probe

The step is a sum of terms, each printed with where its figure comes from:

- compute: one GPU's step (forward, backward, optimizer) times --batches-per-allreduce: the
  median of the probe's timed steps, or --step-ms (the probe's layer profile scaled to it);
- the allreduce the backward does not hide, on a ring of nodes x GPUs processes whose slowest
  link is a node's (tools/scaling_model.py), at the bandwidth and latency the probe fitted;
- Horovod's cycle: what waiting for its background thread's next cycle adds to that;
- the ring's growth with N: the wire stretched by 1 + spread x log2(N / 2), with the spread the
  probe fitted over rings of several sizes (0, and said so, where it had only one);
- host work per request: Horovod's cost on the host of each allreduce request the path makes
  (one per gradient tensor from the hooks, one in all on the path "one"), as the probe measured
  it on its device; DDP reduces its buckets from C++ and gets none;
- the wait for the slowest of N: the expected slowest of N draws of the probe's step times,
  less their median (a synchronous step waits for the last rank's gradients);
- compute slowed beside the allreduce: the backward that runs beside an allreduce, times how
  much slower the probe's backward ran while an allreduce ran beside it, less 1.

Without --from, the constants the scaling model was fitted with on the emulated cluster stand
in for the network (scaling_model.FITTED) and --link-gbps gives the link; the terms that need a
probe are then left out, and the output says so. A probe whose largest message was too small to
show the link holds no bandwidth: --link-gbps then gives it, with the probe's other figures.
--hierarchical models Horovod's hierarchical
allreduce, a ring of nodes between two steps inside each node (scaling_model.message_s), at the
node's rate and latency the probe measured where it ran several processes a host, or at
--hierarchical-gbps G. --algorithm tree models NCCL's double binary tree across the nodes
instead of the ring (scaling_model.tree_s), at the probe's bandwidth: a probe run under
NCCL_ALGO=Ring keeps the ring's figures. What no term holds: the chain of a node's GPUs inside
NCCL's tree, and a flat ring's use of a node's faster internal links (a node is one link).
"""
import argparse
import json
import math
import statistics
import sys

from tools import layer_profile, scaling_model

TINY_CYCLE_S = 1e-7  # a cycle short enough that waiting for it costs nothing
# What a prediction needs of a probe file (tools/allreduce.py writes more).
PROBE_KEYS = ("n", "hosts", "device", "bandwidth_bps", "latency_s", "tensor_bytes", "profile", "step_times_s")


def expected_slowest(times, n):
    """The expected largest of n independent draws from the empirical distribution `times`."""
    xs, m = sorted(times), len(times)
    return sum(x * ((i / m) ** n - ((i - 1) / m) ** n) for i, x in enumerate(xs, 1))


def job_point(probe, nodes, gpus, step_s=None, port="horovod", path="hooks", compiled=False,
              fp16=False, k=1, cycle_s=None, link_bps=None, intra=None, algorithm="ring"):
    """(the scaling model's point for the job, its params, the step times scaled as the compute
    is, notes): the probe's figures where there is a probe, else the emulator's fitted ones."""
    notes = []
    median = statistics.median(probe["step_times_s"]) if probe.get("step_times_s") else probe["profile"]["step_s"]
    compute = step_s if step_s is not None else median
    # The profile's layers keep their proportions, scaled to the step (its own steps are slower:
    # they wait for every gradient's hook).
    profile = layer_profile.scaled(probe["profile"], compute, "--step-ms" if step_s else "the probe's timed steps")
    times = [t * compute / median for t in probe.get("step_times_s", [])]
    n = nodes * gpus
    if link_bps is not None:
        params, rate = scaling_model.FITTED, link_bps
        point_spread = "the emulator's fit"
        notes.append("no probe: the link's efficiency, latency and spread are the scaling model's fit on the "
                     f"emulated cluster {scaling_model.FITTED}, not this cluster's")
    else:
        spread = probe.get("spread") or 0.0
        # The probe's bandwidth at its own N holds that N's stretch; the model wants the ring of 2.
        rate = probe["bandwidth_bps"] * (1 + spread * math.log2(max(probe["n"], 2) / 2))
        params = (1.0, probe["latency_s"], spread)
        point_spread = ("not measured: the probe had rings of one size" if probe.get("spread") is None
                        else "the probe's fit over its rings")
        if probe.get("hosts", 2) < 2 and nodes > 1:
            notes.append("the probe ran on one host: its bandwidth is that host's, not your nodes' network")
    regions = port == "horovod" and compiled and path == "regions"
    point = dict(n=n, tensors=probe["tensor_bytes"], rate_bps=rate, compute_s=compute,
                 backward_s=profile["backward_s"], ready=layer_profile.ready_times(profile, regions=regions),
                 k=k, fp16=fp16, port=port,
                 compiled="regions" if regions else compiled and port == "horovod",
                 cycle_s=cycle_s if cycle_s is not None else probe.get("cycle_s", scaling_model.CYCLE_S),
                 spread_source=point_spread)
    if intra is not None:  # Horovod's hierarchical allreduce: a ring of nodes; (rate, latency) inside one
        point.update(nodes=nodes, intra_bps=intra[0], intra_latency_s=intra[1])
    elif algorithm != "ring":  # NCCL's tree spans the nodes (a node's GPUs are a chain inside it);
        # on one node, its GPUs, each on a link as the ring's are
        point.update(algorithm=algorithm, nodes=nodes if nodes > 1 else None)
    return point, params, times, notes


def terms(point, params, probe, times, path="hooks"):
    """[(term, seconds a step, where its figure comes from)] for the point; their sum is the step."""
    k, n = point.get("k", 1), point["n"]
    compute = k * point["compute_s"]
    flat = params[:2] + (0.0,)
    horovod = point["port"] == "horovod"
    quick = scaling_model.step_s(dict(point, cycle_s=TINY_CYCLE_S), flat) if horovod else None
    no_spread = scaling_model.step_s(point, flat)
    with_spread = scaling_model.step_s(point, params)
    out = [("compute", compute, f"{k} x one GPU's step" if k > 1 else "one GPU's step"),
           ("allreduce not hidden", (quick if horovod else no_spread) - compute,
            (f"{point['algorithm']} of " + (f"{point['nodes']} nodes" if point.get("nodes") else f"{n}")
             if point.get("algorithm", "ring") != "ring"
             else f"ring of {point['nodes']} nodes, hierarchical ({point['intra_bps'] / 1e9:.3g} Gbit/s inside)"
             if point.get("nodes") else f"ring of {n}")
            + f", {point['rate_bps'] / 1e9:.3g} Gbit/s, {params[1] * 1e6:.3g} us a message")]
    if horovod:
        out.append(("Horovod's cycle", no_spread - quick, f"{point['cycle_s'] * 1e3:g} ms cycle"))
    out.append(("ring's growth with N", with_spread - no_spread,
                f"spread {params[2]:.3f} per doubling ({point['spread_source']})"))
    request_s = probe.get("request_s")
    requests = 0 if not horovod else 1 if path == "one" else len(point["tensors"])
    if request_s is None and requests:
        out.append(("host work per request", 0.0, "not measured (no probe)"))
    else:
        out.append(("host work per request", requests * (request_s or 0.0),
                    f"{requests} requests x {(request_s or 0) * 1e6:.0f} us" if requests
                    else "DDP: buckets reduced from C++"))
    if times and n > 1:
        slowest = math.sqrt(k) * (expected_slowest(times, n) - statistics.median(times))
        out.append(("wait for the slowest of N", slowest, f"{len(times)} timed steps, expected slowest of {n}"))
    else:
        out.append(("wait for the slowest of N", 0.0, "not measured (no probe)" if not times else "one process"))
    alone, beside = probe.get("backward_alone_s"), probe.get("backward_beside_allreduce_s")
    if alone and beside and n > 1:
        total = scaling_model.point_message_s(point, sum(point["tensors"]), params)
        exposed = with_spread - compute
        hidden = min(point["backward_s"], max(0.0, total - exposed))
        factor = beside / alone
        out.append(("compute slowed beside the allreduce", max(0.0, factor - 1) * hidden,
                    f"backward x{factor:.2f} beside an allreduce, {hidden * 1e3:.2f} ms of it overlapped"))
    else:
        out.append(("compute slowed beside the allreduce", 0.0,
                    "not measured (no probe)" if not alone else "one process"))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="probe", metavar="PROBE.json", help="what tools.allreduce --json wrote")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus-per-node", type=int, default=1)
    p.add_argument("--step-ms", type=float, help="one GPU's step in ms (default: the probe's timed steps)")
    p.add_argument("--link-gbps", type=float, help="without a probe, or with one whose sizes did not show the "
                   "link: the link between nodes, Gbit/s")
    p.add_argument("--arch", default="resnet18", help="without a probe: the model (default: %(default)s)")
    p.add_argument("--batch", type=int, default=128, help="without a probe: per GPU (default: %(default)s)")
    p.add_argument("--port", choices=("horovod", "ddp"), default="horovod")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--grad-allreduce", choices=("auto", "hooks", "one", "regions"), default="auto")
    p.add_argument("--fp16-allreduce", action="store_true")
    p.add_argument("--batches-per-allreduce", type=int, default=1)
    p.add_argument("--cycle-ms", type=float, help="Horovod's cycle (default: the probe's, else 1)")
    p.add_argument("--hierarchical", action="store_true",
                   help="Horovod's hierarchical allreduce (HOROVOD_HIERARCHICAL_ALLREDUCE=1), inside a node at "
                        "the rate the probe measured there")
    p.add_argument("--hierarchical-gbps", type=float, metavar="GBPS",
                   help="the same, with this rate inside a node, Gbit/s")
    p.add_argument("--algorithm", choices=("ring", "tree"), default="ring",
                   help="NCCL's allreduce across the nodes: ring, or its double binary tree (NCCL_ALGO=Tree)")
    args = p.parse_args(argv)

    def fail(message):  # one line, as the trainers' errors
        print(f"predict: error: {message}", file=sys.stderr)
        sys.exit(2)
    hierarchical = args.hierarchical or args.hierarchical_gbps is not None
    if hierarchical and args.port != "horovod":
        fail("--hierarchical is Horovod's (HOROVOD_HIERARCHICAL_ALLREDUCE); DDP's NCCL picks its own algorithm")
    if hierarchical and args.algorithm != "ring":
        fail("--hierarchical is a ring of nodes; give it or --algorithm tree, not both")
    if args.nodes < 1 or args.gpus_per_node < 1 or args.batches_per_allreduce < 1:
        fail("--nodes, --gpus-per-node and --batches-per-allreduce must be positive")
    if args.probe:
        try:
            with open(args.probe) as f:
                probe = json.load(f)
        except (OSError, ValueError) as e:
            fail(f"cannot read the probe {args.probe} ({e}); write it with python -m tools.allreduce --json FILE")
        missing = [key for key in PROBE_KEYS if key not in probe]
        if missing:
            fail(f"{args.probe} lacks {', '.join(missing)}: write it anew with "
                 "python -m tools.allreduce --json FILE")
        if probe["bandwidth_bps"] is None and args.link_gbps is None:
            fail(f"{args.probe} holds no bandwidth ({probe.get('bandwidth_reason') or 'not measured'}); "
                 "give the link with --link-gbps G")
        if probe["bandwidth_bps"] is None:  # the user's link with the probe's other figures
            probe = dict(probe, bandwidth_bps=args.link_gbps * 1e9)
        link = None
    else:
        if args.link_gbps is None or args.step_ms is None:
            fail("without --from PROBE.json, give --link-gbps and --step-ms (or run tools.allreduce first)")
        profile = layer_profile.measure(args.arch, args.batch)
        probe = {"profile": profile, "tensor_bytes": [b for layer in profile["layers"] for b in layer["bytes"]]}
        link = args.link_gbps * 1e9
    intra = None
    if hierarchical:
        node = probe.get("node") or {}
        if args.hierarchical_gbps is None and not node:
            fail("--hierarchical needs a probe run with 2 or more processes on each of 2 or more hosts "
                 "(its node's ring), or --hierarchical-gbps")
        intra = (args.hierarchical_gbps * 1e9 if args.hierarchical_gbps is not None else node["bandwidth_bps"],
                 node.get("latency_s", 0.0))
    path = args.grad_allreduce
    if path == "auto":  # as the port chooses (training/ports/hvd_port.py)
        path = "hooks" if not args.compile else "one" if args.nodes == 1 else "regions"
    step_s = args.step_ms / 1e3 if args.step_ms else None
    point, params, times, notes = job_point(
        probe, args.nodes, args.gpus_per_node, step_s, args.port, path, args.compile, args.fp16_allreduce,
        args.batches_per_allreduce, args.cycle_ms / 1e3 if args.cycle_ms else None, link, intra, args.algorithm)
    rows = terms(point, params, probe, times, path)
    step = sum(s for _, s, _ in rows)
    what = f"{args.port}" + (f" --compile ({path})" if args.compile else f" ({path})" if args.port == "horovod"
                             else "")
    print(f"{args.nodes} node(s) x {args.gpus_per_node} GPU(s), {what}"
          + (f", from {args.probe} ({probe['device']}, {probe['n']} processes on {probe['hosts']} host(s))"
             if args.probe else ""))
    for name, s, source in rows:
        print(f"  {name:<36} {s * 1e3:9.3f} ms   {source}")
    print(f"  {'step':<36} {step * 1e3:9.3f} ms   efficiency {point['k'] * point['compute_s'] / step:.3f} "
          "(1.0 = N times one GPU's images/s)")
    for note in notes:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
