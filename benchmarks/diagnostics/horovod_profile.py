"""Where an np=2 step's time goes, Horovod's and DDP's: one run of each, the same work, with
Horovod's timeline and a per-thread CPU view, over the steady state (the epochs after the first).

    .venv/bin/python -m benchmarks.diagnostics.horovod_profile          # MobileNet, batch 16
    .venv/bin/python -m benchmarks.diagnostics.horovod_profile --arch lenet --batch 64 --size 5000 --epochs 4
    HOROVOD_CYCLE_TIME=5 .venv/bin/python -m benchmarks.diagnostics.horovod_profile  # a setting

For each trainer: its step time (metrics.csv), and every thread of both ranks with its CPU time
and voluntary context switches (/proc/PID/task/TID: a thread that wakes to poll shows as many
switches and little CPU). For Horovod also, from its timeline (HOROVOD_TIMELINE, with
HOROVOD_TIMELINE_MARK_CYCLES=1; rank 0 writes it): per step, the background thread's cycles,
the allreduces it ran (each a fused response of one or more gradients), and the wall time
covered by each activity: negotiating (a gradient is ready here and waits for the other rank's),
copying into and out of the fusion buffer, and gloo's allreduce. docs/PERFORMANCE.md reads them.
Not a figure: run.py does not list it. Writes --out (JSON) and prints a summary.
"""
import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time

from benchmarks import harness, trainer_runs

ACTIVITIES = ("NEGOTIATE_ALLREDUCE", "ALLREDUCE", "MEMCPY_IN_FUSION_BUFFER", "GLOO_ALLREDUCE",
              "MEMCPY_OUT_FUSION_BUFFER")


def thread_times(pid):
    """{tid: (name, cpu seconds, voluntary context switches)} of a process's threads, now."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"{base}/comm") as f:
                name = f.read().strip()
            with open(f"{base}/status") as f:
                switches = next(int(ln.split()[1]) for ln in f if ln.startswith("voluntary_ctxt_switches"))
        except (OSError, StopIteration):
            continue
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / tick, switches)
    return out


def profiled_run(cmd, ckpt, script, env_extra, epochs):
    """Run a job; sample its ranks' threads when metrics.csv gets its first row (epoch 1 ends) and
    when it gets its last. Returns the rows, the window's wall-clock bounds, and each rank's
    threads over it (epochs 2.. with their evaluations and checkpoint saves)."""
    proc = subprocess.Popen(cmd, cwd=harness.ROOT, env=trainer_runs.env(env_extra), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    metrics = os.path.join(ckpt, "metrics.csv")
    samples, ranks = {}, {}
    while proc.poll() is None and len(samples) < 2:
        try:
            with open(metrics) as f:
                done = len(f.read().splitlines()) - 1
        except OSError:
            done = 0
        mark = {1: "start", epochs: "end"}.get(done)
        if mark and mark not in samples:
            ranks = ranks or {pid: rank for rank, pid in trainer_runs.rank_pids(script, ckpt).items()}
            try:
                samples[mark] = (time.time(), {pid: thread_times(pid) for pid in ranks})
            except OSError:  # a rank ended meanwhile
                pass
        time.sleep(0.05)
    output, _ = proc.communicate()
    if proc.returncode != 0 or len(samples) < 2 or len(ranks) != 2:
        raise RuntimeError(f"profiled run failed ({proc.returncode}): {' '.join(cmd)}\n{output[-3000:]}")
    with open(metrics) as f:
        rows = f.read().splitlines()
    (t0, start), (t1, end) = samples["start"], samples["end"]
    threads = {}
    for pid, now in end.items():
        before = start.get(pid, {})
        threads[ranks[pid]] = sorted(
            ({"tid": tid, "name": name, "main": tid == pid, "cpu_s": cpu - before.get(tid, (name, 0, 0))[1],
              "voluntary_switches": sw - before.get(tid, (name, 0, 0))[2]} for tid, (name, cpu, sw) in now.items()),
            key=lambda t: -t["cpu_s"])
    return rows, (t0, t1), threads


def read_timeline(path):
    """Horovod's timeline: (its start in epoch microseconds, its events). A timeline that the
    job's end cut off misses its closing bracket."""
    text = open(path).read().rstrip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    t0 = next(e["args"]["start_time_since_epoch_in_micros"] for e in events
              if e.get("name") == "process_name" and "start_time_since_epoch_in_micros" in e.get("args", {}))
    return t0, events


def union_us(intervals):
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def timeline_per_step(path, window, steps):
    """Per step over the window: cycles, allreduce responses, and the wall time (ms) covered by
    each activity, from the intervals of every gradient's B/E events."""
    origin, events = read_timeline(path)
    lo, hi = (window[0] * 1e6 - origin, window[1] * 1e6 - origin)
    stacks, spans = {}, {a: [] for a in ACTIVITIES}
    responses, cycles = set(), 0
    for e in events:
        ts = e.get("ts")
        if e.get("ph") == "i" and e.get("name") == "CYCLE_START" and lo <= ts <= hi:
            cycles += 1
        elif e.get("ph") == "B":
            stacks.setdefault(e["pid"], []).append((e["name"], ts))
        elif e.get("ph") == "E" and stacks.get(e["pid"]):
            name, begin = stacks[e["pid"]].pop()
            if name in spans and lo <= begin and ts <= hi:
                spans[name].append((begin, ts))
                if name == "ALLREDUCE":
                    responses.add(begin)
    per_step = {a: union_us(v) / 1e3 / steps for a, v in spans.items()}
    return {"cycles_per_step": cycles / steps, "allreduce_responses_per_step": len(responses) / steps,
            "gradients_allreduced_per_step": len(spans["ALLREDUCE"]) / steps,
            "wall_ms_per_step": per_step}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="mobilenet")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--size", type=int, default=1600, help="training images (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=3, help="the first is untimed (default: %(default)s)")
    p.add_argument("--out", default=None, help="JSON file (default: a temporary file, printed)")
    args = p.parse_args(argv)
    scratch = tempfile.mkdtemp(prefix="hvd-profile-")
    cfg = dict(arch=args.arch, train_size=args.size, train_batch=args.batch, train_epochs=args.epochs,
               skip_epochs=1)
    try:
        runs = trainer_runs.TrainerRuns(cfg, scratch)
        result = {"setup": dict(cfg, env={k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")}),
                  "machine": harness.machine_info()}
        for name, kind in (("horovod", "hvd2"), ("ddp", "ddp2")):
            ckpt = os.path.join(scratch, name)
            cmd = runs.command(kind, ckpt) + ["--warmup-epochs", "0"]
            extra = {}
            if name == "horovod":
                extra = {"HOROVOD_TIMELINE": os.path.join(scratch, "timeline.json"),
                         "HOROVOD_TIMELINE_MARK_CYCLES": "1"}
            rows, window, threads = profiled_run(cmd, ckpt, "main_ddp.py" if kind == "ddp2" else
                                                 "main_horovod.py", extra, args.epochs)
            timed = [dict(zip(rows[0].split(","), r.split(","))) for r in rows[2:]]
            seconds = sum(float(r["epoch_time_s"]) for r in timed)
            steps = len(timed) * -(-args.size // (2 * args.batch))
            side = {"step_ms": 1e3 * seconds / steps, "timed_steps": steps, "threads": threads,
                    "window_s": window[1] - window[0]}
            if name == "horovod":
                side["timeline"] = timeline_per_step(extra["HOROVOD_TIMELINE"], window, steps)
            result[name] = side
            harness.log(f"{name}: {side['step_ms']:.1f} ms per step over {steps} steps")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out = args.out or tempfile.mkstemp(prefix="hvd-profile-", suffix=".json")[1]
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    print_summary(result)
    print(f"written: {out}")
    return result


def print_summary(res):
    for name in ("horovod", "ddp"):
        side = res[name]
        print(f"\n{name}: {side['step_ms']:.1f} ms per step ({side['timed_steps']} steps)")
        for rank, threads in sorted(side["threads"].items()):
            busy = [t for t in threads if t["cpu_s"] > 0.01 or t["voluntary_switches"] > 100]
            for t in busy:
                print(f"  rank {rank} {'main' if t['main'] else 'thread'} {t['tid']} ({t['name']}): "
                      f"{1e3 * t['cpu_s'] / side['timed_steps']:.1f} ms CPU/step "
                      f"({100 * t['cpu_s'] / side['window_s']:.0f}% of a core), "
                      f"{t['voluntary_switches'] / side['timed_steps']:.1f} switches/step")
        if "timeline" in side:
            tl = side["timeline"]
            print(f"  timeline per step: {tl['cycles_per_step']:.1f} cycles, {tl['allreduce_responses_per_step']:.1f} "
                  f"allreduces of {tl['gradients_allreduced_per_step']:.1f} gradients; wall ms: " +
                  ", ".join(f"{k} {v:.2f}" for k, v in tl["wall_ms_per_step"].items()))


if __name__ == "__main__":
    main()
