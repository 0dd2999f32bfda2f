"""Figure hierarchical_allreduce_error: the scaling model's hierarchical allreduce
(tools/scaling_model.py's message_s with `nodes`, what tools.predict --hierarchical uses) against
the algorithm run on namespace hosts of several processes each.

Namespace hosts stand for nodes of 2 processes each: the link between hosts is shaped (RATE_BPS
of real time, no dilation: nothing here computes), the two processes of a host talk over its
loopback, unshaped, as a node's GPUs over their faster internal links. On the first 2 and then
all 4 hosts the allreduce probe runs (tools/allreduce.py, ResNet-18's gradients, 44.7 MB). It
times the flat ring of every process and a node's own ring, each fitted to a line (latency and
bandwidth: tools/linkfit.py, over the median of each size's repeats), and the hierarchical
allreduce of all the gradients: a reduce-scatter inside each node, an allreduce of each
process's share across the nodes (a node's processes each run a ring of their own, side by side
on its link), an allgather inside the node. Those are
HOROVOD_HIERARCHICAL_ALLREDUCE's steps; gloo has no hierarchical path of its own, so they are
made of Horovod's reducescatter, allreduce and allgather over process sets.

The figure is the largest relative error, over the host counts, of the hierarchical time the
model predicts from the flat ring's and the node's fitted lines alone against the time measured.
Recorded beside it: the flat ring's time of the same bytes, and its error as a prediction of the
hierarchical time (what a model without the hierarchy would miss).
"""
import json
import os
import shutil
import tempfile

from benchmarks import harness
from tools import emulate

NAME = "hierarchical_allreduce_error"
GOAL = ("<=", 0.10)
DESCRIPTION = "scaling model: relative error of the hierarchical allreduce's time, 2 and 4 hosts of 2 processes"
RATE_BPS = 100e6  # each host's link, real time
SLOTS = 2
ARCH = "resnet18"
FULL = dict(hosts=(2, 4), repeats=3)
QUICK = dict(hosts=(2,), repeats=1)


def probe(hosts, repeats, folder):
    """tools.allreduce on the hosts' slots: its JSON."""
    path = os.path.join(folder, f"probe{hosts.n}.json")
    # Horovod's cycle at 5 ms: 8 processes' background threads share 2 cores; a cycle adds to a
    # message's latency, not to the slope its bandwidth is read from.
    emulate.launch(hosts, "horovod", ["-m", "tools.allreduce", "--arch", ARCH, "--batch-size", "2", "--steps", "1",
                                      "--repeats", str(repeats), "--json", path],
                   {"HOROVOD_CYCLE_TIME": "5"}, timeout=1800, work=folder)
    with open(path) as f:
        return json.load(f)


def run(cfg, ctx):
    if os.geteuid() != 0:
        return {"value": None, "skipped": "needs root, for the namespace hosts"}
    folder = tempfile.mkdtemp(prefix="cifar-hier-")
    points = []
    try:
        with emulate.Hosts(max(cfg["hosts"]), RATE_BPS, folder, slots=SLOTS) as hosts:
            for n in cfg["hosts"]:
                found = probe(hosts.first(n), cfg["repeats"], folder)
                h, node = found["hierarchical"], found["node"]
                point = {"hosts": n, "processes": found["n"], "bytes": h["bytes"], "measured_s": h["seconds"],
                         "predicted_s": h["predicted_s"], "flat_s": h["flat_seconds"],
                         "flat_bandwidth_bps": found["bandwidth_bps"], "flat_latency_s": found["latency_s"],
                         "node_bandwidth_bps": node["bandwidth_bps"], "node_latency_s": node["latency_s"]}
                point["error"] = abs(point["predicted_s"] - point["measured_s"]) / point["measured_s"]
                point["flat_error"] = abs(point["flat_s"] - point["measured_s"]) / point["measured_s"]
                points.append(point)
                harness.log(f"{n} hosts x {SLOTS}: hierarchical {h['seconds'] * 1e3:.0f} ms, predicted "
                            f"{h['predicted_s'] * 1e3:.0f} ms, flat ring {h['flat_seconds'] * 1e3:.0f} ms")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    value = max(p["error"] for p in points)
    return {"value": value, "repeats": [value], "mean_error": sum(p["error"] for p in points) / len(points),
            "points": points, "setup": {"rate_bps": RATE_BPS, "slots": SLOTS, "arch": ARCH,
                                        "probe_repeats": cfg["repeats"]}}


def markdown(fig):
    s = fig["setup"]
    L = [f"Namespace hosts of {s['slots']} processes each, links of {s['rate_bps'] / 1e6:g} Mbit/s between them "
         f"(real time), loopback inside; {s['arch']}'s gradients in one allreduce.", "",
         f"The model's hierarchical allreduce, from the flat ring's and a node's fitted lines, misses the measured "
         f"time by **{fig['value']:.3f}** at worst (goal {GOAL[1]}), {fig['mean_error']:.3f} on average.", "",
         "| hosts x processes | MB | hierarchical, measured (ms) | the model (ms) | error | flat ring (ms) | "
         "flat ring's error | flat ring fit | node's ring fit |", "|" + " --- |" * 9]
    for p in fig["points"]:
        L.append(f"| {p['hosts']} x {p['processes'] // p['hosts']} | {p['bytes'] / 1e6:.1f} | "
                 f"{p['measured_s'] * 1e3:.0f} | {p['predicted_s'] * 1e3:.0f} | {p['error']:.3f} | "
                 f"{p['flat_s'] * 1e3:.0f} | {p['flat_error']:.3f} | {p['flat_bandwidth_bps'] / 1e6:.1f} Mbit/s, "
                 f"{p['flat_latency_s'] * 1e3:.1f} ms | {p['node_bandwidth_bps'] / 1e6:.0f} Mbit/s, "
                 f"{p['node_latency_s'] * 1e3:.1f} ms |")
    return L + [""]
