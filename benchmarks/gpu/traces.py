"""The step traces of one GPU command: each port beside main.py, at batch 128 and 512, under
torch.profiler (benchmarks/gpu/step_trace.py), then the report (benchmarks/gpu/trace_report.py).

    python -m benchmarks.gpu.traces OUT plain [--budget S] [--cpu-smoke]     # main.py, DDP
    .venv/bin/python -m benchmarks.gpu.traces OUT horovod [--budget S]       # needs Horovod

ResNet-18, bf16, --compile (reduce-overhead on CUDA), synthetic data: each run traces 30 steps
after 25 untraced ones (compiling and CUDA-graph recording) and stops. The ports run at one
process with the reduction that every job of two or more runs: DDP under torchrun, Horovod
with its reduction forced on, on each of its paths (--grad-allreduce hooks, one, regions).
TORCH_LOGS="cudagraphs,recompiles,graph_breaks,perf_hints" goes to OUT/traces/NAME.log beside
each trace. Where nsys exists, the first run of the set is also captured by it, and its kernel
and CUDA API summaries are kept as text (OUT/traces/NAME.nsys.txt). Runs that would not fit in
--budget seconds are skipped and say so. `--cpu-smoke`: LeNet, small, on the CPU, to try the
command before spending GPU time on it.
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

from benchmarks.gpu import trace_report
from benchmarks.trainer_runs import ROOT, env

BF16 = ["--amp", "--amp-dtype", "bfloat16", "--compile"]
BIG = ["--batch-size", "512", "--lr", "0.4"]
SETS = {  # name: (launcher, script, flags)
    "plain": {
        "main_bs128": ("python", "main.py", BF16),
        "ddp_bs128": ("torchrun", "main_ddp.py", BF16),
        "main_bs512": ("python", "main.py", [*BF16, *BIG]),
        "ddp_bs512": ("torchrun", "main_ddp.py", [*BF16, *BIG]),
    },
    "horovod": {
        "hvd_hooks_bs128": ("horovodrun", "main_horovod.py", [*BF16, "--grad-allreduce", "hooks"]),
        "hvd_one_bs128": ("horovodrun", "main_horovod.py", [*BF16, "--grad-allreduce", "one"]),
        "hvd_regions_bs128": ("horovodrun", "main_horovod.py", [*BF16, "--grad-allreduce", "regions"]),
        "hvd_hooks_bs512": ("horovodrun", "main_horovod.py", [*BF16, *BIG, "--grad-allreduce", "hooks"]),
        "hvd_one_bs512": ("horovodrun", "main_horovod.py", [*BF16, *BIG, "--grad-allreduce", "one"]),
    },
}
TORCH_LOGS = "cudagraphs,recompiles,graph_breaks,perf_hints"
STEPS = dict(wait=25, warmup=3, active=30)
SMOKE_STEPS = dict(wait=3, warmup=1, active=5)
RUN_S = 120  # what one run may take: a compile of ResNet-18 and 58 steps


def command(py, launcher, script, flags, out, name, data_dir, cfg, steps):
    trace = ["-m", "benchmarks.gpu.step_trace", out, name, script,
             *(f"--{k}={v}" for k, v in steps.items())]
    base = ["--dataset", "synthetic", "--synthetic-size", str(cfg["images"]), "--data-dir", data_dir,
            "--arch", cfg["arch"], "--epochs", "1", "--log-interval", "100000", "--overwrite",
            "--checkpoint-dir", os.path.join(out, "ckpt-" + name), *flags]
    if cfg["smoke"]:  # the CPU has no CUDA graphs, and LeNet no batch of 512 in 600 images
        base = [a for a in base if a not in ("--amp", "--amp-dtype", "bfloat16")]
        base += ["--batch-size", "32"]
    if launcher == "torchrun":
        return [py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", *trace, *base]
    if launcher == "horovodrun":
        return [os.path.join(os.path.dirname(py), "horovodrun"), "-np", "1", "--gloo", py, *trace, *base]
    return [py, *trace, *base]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("set", choices=SETS)
    p.add_argument("--budget", type=float, default=600, help="seconds in all (default: %(default)s)")
    p.add_argument("--cpu-smoke", action="store_true", help="LeNet on the CPU, small")
    args = p.parse_args(argv)
    started = time.monotonic()
    out = os.path.join(args.out, "traces")
    os.makedirs(out, exist_ok=True)
    cfg = dict(smoke=args.cpu_smoke, arch="lenet" if args.cpu_smoke else "resnet18",
               images=600 if args.cpu_smoke else 128 * 60)
    steps = SMOKE_STEPS if args.cpu_smoke else STEPS
    py = sys.executable
    data_dir = os.path.join(out, "data")
    extra = {"TORCH_LOGS": TORCH_LOGS}
    if args.cpu_smoke:
        extra["CUDA_VISIBLE_DEVICES"] = ""
    nsys = shutil.which("nsys") if not args.cpu_smoke else None
    failed = 0
    for i, (name, (launcher, script, flags)) in enumerate(SETS[args.set].items()):
        left = args.budget - (time.monotonic() - started)
        if left < RUN_S * (0.2 if args.cpu_smoke else 1):
            print(f"traces: {name} skipped: {left:.0f} s left of --budget", flush=True)
            continue
        cmd = command(py, launcher, script, flags, out, name, data_dir, cfg, steps)
        if nsys and i == 0:
            cmd = [nsys, "profile", "-t", "cuda,nvtx,osrt", "--force-overwrite", "true", "-o",
                   os.path.join(out, name), *cmd]
        t0 = time.monotonic()
        with open(os.path.join(out, name + ".log"), "w") as log:
            try:
                r = subprocess.run(cmd, cwd=ROOT, env=env(extra, py), stdout=log, stderr=subprocess.STDOUT,
                                   timeout=max(left - 5, 1), stdin=subprocess.DEVNULL)
                code = r.returncode
            except subprocess.TimeoutExpired:
                code = "timed out"
        ok = code == 0 and os.path.exists(os.path.join(out, name + ".trace.json.gz"))
        failed += not ok
        print(f"traces: {name}: {'ok' if ok else f'FAILED ({code}), see {name}.log'} "
              f"({time.monotonic() - t0:.0f} s)", flush=True)
        if nsys and i == 0 and os.path.exists(os.path.join(out, name + ".nsys-rep")):
            with open(os.path.join(out, name + ".nsys.txt"), "w") as f:
                subprocess.run([nsys, "stats", "-r", "cuda_gpu_kern_sum,cuda_api_sum", "-f", "csv",
                                os.path.join(out, name + ".nsys-rep")], stdout=f, stderr=subprocess.STDOUT)
            os.remove(os.path.join(out, name + ".nsys-rep"))  # tens of MB; the summaries stay
    shutil.rmtree(data_dir, ignore_errors=True)
    for name in os.listdir(out):  # the runs' checkpoints, and nsys's export beside its summary
        if name.startswith("ckpt-"):
            shutil.rmtree(os.path.join(out, name), ignore_errors=True)
        elif name.endswith(".sqlite"):
            os.remove(os.path.join(out, name))
    rows = trace_report.report(out)
    with open(os.path.join(out, f"report-{args.set}.txt"), "w") as f:
        for line in trace_report.lines(rows):
            print(line, flush=True)
            f.write(line + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
