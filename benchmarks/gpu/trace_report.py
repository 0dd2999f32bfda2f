"""What a step's time went to, from the traces of benchmarks/gpu/step_trace.py; runs anywhere.

    python -m benchmarks.gpu.trace_report OUT [--json FILE]

For each OUT/NAME.trace.json.gz, per traced step (the host's ProfilerStep ranges):
  step_ms          the host's time per step
  graph_launches   cudaGraphLaunch calls per step: 0 where CUDA graphs were skipped
  gpu_busy_ms      the training stream's kernel and copy time per step (the stream that holds
                   most of it); gpu_idle_ms, the gaps between its kernels from the first traced
                   kernel to the last, per step
  over_gaps        the host calls (any thread) that lie over the training stream's gaps of more
                   than GAP_US, by the time they cover: what the GPU waited behind
  nccl_ms, copy_ms NCCL's kernels and Horovod's batched copies (batched_memcpy) per step, on
                   any stream
and the compiler's counters beside it (OUT/NAME.counters.json): CUDA-graph skips, re-records.
A trace without CUDA activity (a CPU smoke run) gives the host's figures alone.
"""
import argparse
import collections
import gzip
import json
import os
import sys

GAP_US = 20.0  # shorter gaps are a kernel launch's ordinary latency
HOST_CATS = ("cpu_op", "cuda_runtime", "cuda_driver", "user_annotation", "python_function")


def load(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        trace = json.load(f)
    return [e for e in trace.get("traceEvents", trace if isinstance(trace, list) else [])
            if e.get("ph") == "X" and "dur" in e]


def covered(intervals, lo, hi):
    """How much of [lo, hi] the (start, end) intervals cover, counting overlaps once."""
    total, reach = 0.0, lo
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, hi)
        if b > a:
            total += b - a
            reach = b
    return total


def analyse(events, gap_us=GAP_US):
    steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
    n = max(len(steps), 1)
    host = [e for e in events if e.get("cat") in HOST_CATS and not e["name"].startswith("ProfilerStep#")]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    out = {"steps": len(steps), "step_ms": sum(e["dur"] for e in steps) / n / 1e3,
           "graph_launches": sum(e["name"] == "cudaGraphLaunch" for e in host) / n,
           "gpu": bool(gpu)}
    if not gpu:
        return out
    by_stream = collections.defaultdict(list)
    for e in gpu:
        by_stream[e.get("args", {}).get("stream", e.get("tid"))].append(e)
    main = max(by_stream.values(), key=lambda es: sum(e["dur"] for e in es))
    main.sort(key=lambda e: e["ts"])
    busy = covered([(e["ts"], e["ts"] + e["dur"]) for e in main], main[0]["ts"], main[-1]["ts"] + main[-1]["dur"])
    span = main[-1]["ts"] + main[-1]["dur"] - main[0]["ts"]
    gaps, reach = [], main[0]["ts"] + main[0]["dur"]
    for e in main[1:]:
        if e["ts"] - reach > gap_us:
            gaps.append((reach, e["ts"]))
        reach = max(reach, e["ts"] + e["dur"])
    over = collections.Counter()
    spans = sorted(((e["ts"], e["ts"] + e["dur"], e["name"]) for e in host), key=lambda s: s[0])
    for lo, hi in gaps:
        for a, b, name in spans:
            if a >= hi:
                break
            if b > lo:
                over[name] += min(b, hi) - max(a, lo)

    def kernel_ms(*needles):
        return sum(e["dur"] for e in gpu if any(s in e["name"].lower() for s in needles)) / n / 1e3
    out.update(gpu_busy_ms=busy / n / 1e3, gpu_idle_ms=(span - busy) / n / 1e3, gaps_per_step=len(gaps) / n,
               over_gaps={k: round(v / n / 1e3, 4) for k, v in over.most_common(8)},
               nccl_ms=kernel_ms("nccl"), copy_ms=kernel_ms("batched_memcpy", "batchedd2d"))
    return out


def counters(path):
    """The compiler's counters that tell of CUDA graphs: skips and re-records, by reason."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        c = json.load(f)
    keep = {}
    for group, values in c.items():
        for key, v in values.items():
            if "cudagraph" in key.lower() or "rerecord" in key.lower() or group == "graph_break":
                keep[f"{group}.{key.splitlines()[0][:100]}"] = v
    return keep


def report(folder):
    rows = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".trace.json.gz"):
            run = name.removesuffix(".trace.json.gz")
            rows[run] = dict(analyse(load(os.path.join(folder, name))),
                             counters=counters(os.path.join(folder, run + ".counters.json")))
    return rows


def lines(rows):
    for run, r in rows.items():
        text = f"{run}: {r['steps']} steps, host {r['step_ms']:.2f} ms a step, {r['graph_launches']:.1f} graph launches"
        if r["gpu"]:
            text += (f"; GPU busy {r['gpu_busy_ms']:.2f} ms, idle {r['gpu_idle_ms']:.2f} ms in "
                     f"{r['gaps_per_step']:.1f} gaps; NCCL {r['nccl_ms']:.3f} ms, copies {r['copy_ms']:.3f} ms")
        yield text
        if r.get("over_gaps"):
            yield "    over the gaps (ms a step): " + ", ".join(f"{k} {v:.3f}" for k, v in r["over_gaps"].items())
        if r["counters"]:
            yield "    counters: " + ", ".join(f"{k} {v}" for k, v in r["counters"].items())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder")
    p.add_argument("--json", default=None, help="also write the figures here")
    args = p.parse_args(argv)
    rows = report(args.folder)
    if not rows:
        print(f"trace_report: no *.trace.json.gz in {args.folder}", file=sys.stderr)
        return 1
    for line in lines(rows):
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
