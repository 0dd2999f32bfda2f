"""`make gpu-check`: on a GPU machine, set up against its PyTorch, then run short real jobs.

    make gpu-check                         # set-up (TORCH=system where a CUDA torch exists), then jobs
    make gpu-check GPU_PYTHON=/opt/conda/bin/python
    python3 -m scripts.gpu_check --device cpu --quick --no-setup      # the same jobs on the CPU

Each job prints one line with its images/s (the last epoch's, from metrics.csv) or why it
failed; the exit status is non-zero if any job failed. Without a GPU it says so in one
line and exits 1 at once. Offline, give the set-up HOROVOD_SDIST= and WHEELS= (docs/INSTALL.md).
The lines also go to --out (JSON) for benchmarks/results/RESULTS.md.

It uses the standard library only (and trainer_runs, which does too), so any python3
runs it before the set-up; the jobs run in the set-up's .venv.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks.trainer_runs import ROOT, env, run_trainer, shown

VENV_PY = os.path.join(ROOT, ".venv", "bin", "python")


def say(line):
    print(f"gpu-check: {line}", flush=True)


def gpus():
    """The GPUs nvidia-smi lists, or None without a usable nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return None
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("GPU")]
    return lines if r.returncode == 0 and lines else None


def has_cuda_torch(python):
    code = "import torch, torchvision, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        return subprocess.run([python, "-c", code], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def setup(python):
    setup_env = dict(os.environ)
    if has_cuda_torch(python):
        setup_env.update(TORCH="system", PYTHON=python)
        say(f"set-up against {python}'s PyTorch (TORCH=system)")
    else:
        say(f"{python} has no CUDA PyTorch: set-up with the pinned one (needs the registry)")
    return subprocess.run(["bash", os.path.join(ROOT, "scripts", "setup.sh")], cwd=ROOT, env=setup_env).returncode


# The jobs that give results-gpu.json's port figures and Horovod's levers (merge), by name. Each
# port runs at np=1 with the reduction every job of two or more runs: Horovod's forced on
# (benchmarks.diagnostics.hooks_on) on the path --compile picks on one node (one allreduce),
# DDP with its buckets.
MAIN_BF16, MAIN_BF16_512 = "main.py bf16 --compile", "main.py bf16 --compile, batch 512"
HOOKS_BF16, HOOKS_BF16_512 = "main_horovod.py np=1, hooks on, bf16 --compile", \
    "main_horovod.py np=1, hooks on, bf16 --compile, batch 512"
DDP_BF16, DDP_BF16_512 = "main_ddp.py np=1 (torchrun), bf16 --compile", \
    "main_ddp.py np=1 (torchrun), bf16 --compile, batch 512"
# Horovod's other paths under --compile, beside the default (training/ports/hvd_port.py).
PATHS = {"per-tensor hooks": ["--grad-allreduce", "hooks"], "regions": ["--grad-allreduce", "regions"]}
# Horovod's levers on the per-step cost, each against HOOKS_BF16 (the ports' defaults on CUDA:
# asynchronous completion, a 0.1 ms cycle; training/ports/hvd_port.py).
LEVERS = {
    "1 ms cycle": ([], {"HOROVOD_CYCLE_TIME": "1"}),
    "asynchronous completion off": ([], {"HOROVOD_ENABLE_ASYNC_COMPLETION": "0"}),
    "hooks, --allreduce-groups 1": (["--grad-allreduce", "hooks", "--allreduce-groups", "1"], {}),
    "hooks, no fusion": (["--grad-allreduce", "hooks"], {"HOROVOD_FUSION_THRESHOLD": "0"}),
}


def jobs(cfg):
    """(name, launcher, flags, extra environment[, images]) of each job, the ports' figures first.
    launcher: main | hvd | hooks (main_horovod.py at np=1 with its reduction on and Horovod's
    elastic mode off, benchmarks.diagnostics.hooks_on: the per-rank cost of every np >= 2 job) |
    ddp | nosearch (main.py through benchmarks.gpu.no_cudnn_benchmark)."""
    elastic = {"HOROVOD_ELASTIC": "1"}  # the hooks and Horovod's elastic mode, as main_elastic.py
    bf16, fp16 = ["--amp", "--amp-dtype", "bfloat16"], ["--amp", "--amp-dtype", "float16"]
    big = ["--batch-size", "512", "--lr", "0.4"]
    compiled = [*bf16, "--compile"]
    return [
        (MAIN_BF16, "main", compiled, {}),
        (HOOKS_BF16, "hooks", compiled, {}),
        (DDP_BF16, "ddp", compiled, {}),
        (MAIN_BF16_512, "main", [*compiled, *big], {}),
        (HOOKS_BF16_512, "hooks", [*compiled, *big], {}),
        (DDP_BF16_512, "ddp", [*compiled, *big], {}),
        *[(f"{HOOKS_BF16}, {path}", "hooks", [*compiled, *flags], {}) for path, flags in PATHS.items()],
        *[(f"{HOOKS_BF16_512}, {path}", "hooks", [*compiled, *big, *flags], {}) for path, flags in PATHS.items()],
        *[(f"{HOOKS_BF16}, {lever}", "hooks", [*compiled, *flags], env)
          for lever, (flags, env) in LEVERS.items()],
        (f"{HOOKS_BF16}, elastic mode", "hvd", compiled, elastic),
        ("main.py", "main", [], {}),
        ("main.py --no-channels-last", "main", ["--no-channels-last"], {}),
        ("main.py --amp --amp-dtype bfloat16", "main", bf16, {}),
        ("main.py --amp --amp-dtype float16", "main", fp16, {}),
        ("main.py --compile", "main", ["--compile"], {}),
        ("main_horovod.py np=1", "hvd", [], {}),
        ("main_horovod.py np=1, gradient hooks on", "hooks", [], {}),
        ("main_horovod.py np=1, hooks on, --no-channels-last", "hooks", ["--no-channels-last"], {}),
        ("main_horovod.py np=1, hooks on, bf16", "hooks", bf16, {}),
        ("main_horovod.py np=1, hooks on, fp16", "hooks", fp16, {}),
        ("main_ddp.py np=1 (torchrun)", "ddp", [], {}),
        ("main_ddp.py np=1 (torchrun), bf16", "ddp", bf16, {}),
    ] + [  # fp32 eager at two data sizes, alternating, with cuDNN's algorithm search off
        (f"main.py, cudnn search off, {n:,} images ({i})", "nosearch", [], {}, n)
        for i in (1, 2) for n in (10000, 50000)
    ]


def wanted(args, name):
    return not args.only or any(text in name for text in args.only)


def cpu_only(cfg):
    """--device cpu hides any GPU from the jobs."""
    return {"CUDA_VISIBLE_DEVICES": ""} if cfg["device"] == "cpu" else {}


def failure(text):
    """The line that says why a job failed: the trainer's one-line error, else the last
    exception named in its output (not a launcher's summary of it), else its last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for pick in (lambda ln: ": error: " in ln,
                 lambda ln: re.search(r"\b\w+(Error|Exception)\b", ln) and "ChildFailedError" not in ln):
        found = [ln for ln in lines if pick(ln)]
        if found:
            return found[-1]
    return lines[-1] if lines else "no output"


def run_job(py, cfg, scratch, n, name, launcher, flags, extra, results, images=None):
    ckpt = os.path.join(scratch, f"job{n}")
    images = images or cfg["images"]
    base = ["--dataset", "synthetic", "--synthetic-size", str(images), "--data-dir",
            os.path.join(scratch, f"data{images}"), "--arch", cfg["arch"], "--batch-size", str(cfg["batch"]),
            "--epochs", str(cfg["epochs"]), "--lr", "0.05", "--checkpoint-dir", ckpt, "--log-interval", "1000"]
    script = {"main": "main.py", "hvd": "main_horovod.py", "hooks": "main_horovod.py", "ddp": "main_ddp.py",
              "nosearch": "main.py"}[launcher]
    cmd = [py, script, *base, *flags]
    if launcher == "nosearch":
        cmd = [py, "-m", "benchmarks.gpu.no_cudnn_benchmark", *cmd[1:]]
    if launcher == "hooks":
        cmd = [py, "-m", "benchmarks.diagnostics.hooks_on", *cmd[2:]]
    if launcher in ("hvd", "hooks"):
        cmd = [os.path.join(os.path.dirname(py), "horovodrun"), "-np", "1", "--gloo", *cmd]
    elif launcher == "ddp":
        cmd = [py, "-m", "torch.distributed.run", "--nproc_per_node", "1", *cmd[1:]]
    if not os.path.exists(cmd[0]):
        say(f"{name}: FAILED ({cmd[0]} is missing: run the set-up first)")
        results.append({"job": name, "ok": False, "error": f"{cmd[0]} is missing", "command": shown(cmd)})
        return False, ckpt
    t0 = time.perf_counter()
    r, rows = run_trainer(cmd, ckpt, dict(extra, **cpu_only(cfg)), cfg["timeout"], python=py)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        why = failure(r.stderr + r.stdout)
        say(f"{name}: FAILED ({why[:200]})")
        results.append({"job": name, "ok": False, "error": why, "command": shown(cmd),
                        "output_tail": (r.stderr + r.stdout).splitlines()[-40:]})
        return False, ckpt
    rate = float(rows[-1]["images_per_s"])
    say(f"{name}: {rate:,.0f} img/s (epoch {len(rows)}, {wall:.0f} s in all)")
    results.append({"job": name, "ok": True, "images_per_s": rate, "wall_s": wall, "env": extra, "images": images,
                    "command": shown(cmd)})
    return True, ckpt


def resume_job(py, cfg, scratch, ckpt, results, port="horovod", flags=()):
    """--resume of a finished run one epoch further, as a job of its own: the Horovod port's
    (hooks on) or the DDP port's (under torchrun), with the run's own flags."""
    base = ["--dataset", "synthetic", "--synthetic-size", str(cfg["images"]), "--data-dir",
            os.path.join(scratch, f"data{cfg['images']}"), "--arch", cfg["arch"], "--batch-size", str(cfg["batch"]),
            "--epochs", str(cfg["epochs"] + 1), "--checkpoint-dir", ckpt, "--resume", "--log-interval", "1000",
            *flags]
    if port == "ddp":
        cmd, name = [py, "-m", "torch.distributed.run", "--nproc_per_node", "1", "main_ddp.py", *base], \
            "main_ddp.py np=1, --resume"
    else:
        cmd, name = [os.path.join(os.path.dirname(py), "horovodrun"), "-np", "1", "--gloo", py, "-m",
                     "benchmarks.diagnostics.hooks_on", *base], "main_horovod.py np=1, hooks on, --resume"
    r, rows = run_trainer(cmd, ckpt, cpu_only(cfg), cfg["timeout"], python=py)
    ok = len(rows) == cfg["epochs"] + 1
    if ok:
        say(f"{name}: {float(rows[-1]['images_per_s']):,.0f} img/s (epoch {len(rows)} of {len(rows)})")
    else:
        say(f"{name}: FAILED ({failure(r.stderr + r.stdout)[:200]})")
    results.append({"job": name, "ok": ok, "command": shown(cmd)})
    return ok


SYNCS_JOB = "main_horovod.py np=1, hooks on, fp16: host syncs"


def syncs_job(py, cfg, scratch, results, limit=8):
    """fp16 AMP through Horovod's hooks: the host syncs of a whole epoch, counted by
    benchmarks.gpu.host_syncs. The step loop must add none: an epoch has a fixed few (its
    final reduction, its index upload), `limit` at most, whatever its length."""
    name = SYNCS_JOB
    ckpt = os.path.join(scratch, "syncs")
    cmd = [os.path.join(os.path.dirname(py), "horovodrun"), "-np", "1", "--gloo", py, "-m",
           "benchmarks.gpu.host_syncs", "main_horovod.py", "--dataset", "synthetic", "--synthetic-size",
           str(cfg["images"]), "--data-dir", os.path.join(scratch, f"data{cfg['images']}"), "--arch", cfg["arch"],
           "--batch-size", str(cfg["batch"]), "--epochs", "2", "--checkpoint-dir", ckpt,
           "--log-interval", "100000", "--amp", "--amp-dtype", "float16"]
    r, _ = run_trainer(cmd, ckpt, {"HOROVOD_ELASTIC": "1"}, cfg["timeout"], python=py)  # hooks on at np=1
    epochs = [json.loads(ln[ln.index("{"):]) for ln in r.stdout.splitlines() if '"syncs"' in ln]
    ok = r.returncode == 0 and len(epochs) == 2 and epochs[-1]["syncs"] <= limit
    last = epochs[-1] if epochs else {}
    say(f"{name}: {last.get('syncs', '?')} in an epoch of {last.get('steps', '?')} steps "
        f"({'fixed per epoch' if ok else 'FAILED: more than ' + str(limit)})")
    results.append({"job": name, "ok": ok, "epochs": epochs, "command": shown(cmd)})
    return ok


DIVERGE_JOB = "main.py at --lr 1e38 on CUDA: the divergence guard"


def diverge_job(py, cfg, scratch, results):
    """The divergence guard with CUDA tensors: one line, exit status 3, nothing saved."""
    ckpt = os.path.join(scratch, "diverge")
    cmd = [py, "main.py", "--arch", "lenet", "--dataset", "synthetic", "--synthetic-size", "1000", "--data-dir",
           os.path.join(scratch, "data-diverge"), "--epochs", "3", "--lr", "1e38", "--batch-size", "1024",
           "--checkpoint-dir", ckpt]
    r, _ = run_trainer(cmd, ckpt, cpu_only(cfg), cfg["timeout"], python=py)
    line = ([ln for ln in r.stderr.splitlines() if "diverged" in ln] or ["no divergence line"])[-1]
    ok = r.returncode == 3 and "Traceback" not in r.stderr and not os.path.exists(os.path.join(ckpt, "ckpt.pth"))
    say(f"{DIVERGE_JOB}: exit {r.returncode}, {line.strip()[:120]} ({'ok' if ok else 'FAILED'})")
    results.append({"job": DIVERGE_JOB, "ok": ok, "returncode": r.returncode, "line": line.strip(),
                    "command": shown(cmd)})
    return ok


CUDA_PATHS_JOB = "BatchNorm averaging and check_epoch on CUDA through Horovod"


def cuda_paths_job(py, cfg, results):
    cmd = [os.path.join(os.path.dirname(py), "horovodrun"), "-np", "1", "--gloo", py, "-m", "benchmarks.gpu.cuda_paths"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=cfg["timeout"], env=env(python=py))
    lines = [ln[ln.index("cuda-paths:"):] for ln in r.stdout.splitlines() if "cuda-paths:" in ln]
    for ln in lines:
        say(ln.removeprefix("cuda-paths: "))
    ok = r.returncode == 0 and len(lines) == 2
    if not ok:
        say(f"{CUDA_PATHS_JOB}: FAILED ({failure(r.stderr + r.stdout)[:200]})")
    results.append({"job": CUDA_PATHS_JOB, "ok": ok, "lines": lines, "command": shown(cmd)})
    return ok


def device_name(device, py):
    if device != "cuda":
        return "cpu"
    return subprocess.run([py, "-c", "import torch; print(torch.cuda.get_device_name())"],
                          capture_output=True, text=True).stdout.strip()


class Results(list):
    """The jobs' results, each added to --merge's results-gpu.json as it comes, so that a command
    stopped at its time limit keeps what it measured."""

    def __init__(self, path, device, cfg):
        super().__init__()
        self.path, self.device, self.cfg = path, device, cfg

    def append(self, result):
        super().append(result)
        if self.path:
            merge(self.path, self.device, self.cfg, list(self))


def merge(path, device, cfg, results):
    """Add this command's jobs to the first command's results-gpu.json (benchmarks/gpu/trainer_figures.py), and
    the Horovod-over-main.py speed figure from the two jobs that give it."""
    from benchmarks.gpu import trainer_figures as gpu
    with open(path) as f:
        res = json.load(f)
    rates = {j["job"]: j for j in results if j.get("images_per_s")}
    for name, job in (("horovod_hooks_bs128_bf16", HOOKS_BF16), ("main_bs128_bf16_same_machine", MAIN_BF16),
                      ("horovod_hooks_bs512_bf16", HOOKS_BF16_512), ("main_bs512_bf16_same_machine", MAIN_BF16_512),
                      ("ddp_bs128_bf16", DDP_BF16), ("ddp_bs512_bf16", DDP_BF16_512),
                      *((f"horovod_{path.replace(' ', '_').replace('-', '_')}_bs128_bf16", f"{HOOKS_BF16}, {path}")
                        for path in PATHS),
                      *((f"horovod_{path.replace(' ', '_').replace('-', '_')}_bs512_bf16", f"{HOOKS_BF16_512}, {path}")
                        for path in PATHS)):
        if job in rates:
            res["runs"][name] = {"images_per_s": rates[job]["images_per_s"], "images": cfg["images"],
                                 "command": rates[job]["command"], "env": rates[job]["env"]}
    default = rates.get(HOOKS_BF16, {}).get("images_per_s")
    levers = [*LEVERS, "elastic mode"]
    res["levers"] = {lever: {"images_per_s": rates[f"{HOOKS_BF16}, {lever}"]["images_per_s"],
                             "over_defaults": rates[f"{HOOKS_BF16}, {lever}"]["images_per_s"] / default
                             if default else None} if f"{HOOKS_BF16}, {lever}" in rates
                     else {"images_per_s": None, "over_defaults": None, "why": "not run"}
                     for lever in levers}
    res["second_command"] = {"device": device, "config": cfg, "jobs": results}
    gpu.write(path, res)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: run the same jobs without a GPU (tests use it) (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="LeNet on 500 images: a smoke run")
    p.add_argument("--python", default="python3", help="the Python whose PyTorch to set up against")
    p.add_argument("--no-setup", action="store_true", help="use .venv as it is")
    p.add_argument("--skip", action="append", default=[], metavar="TEXT",
                   help="leave out the jobs whose name contains TEXT (repeatable)")
    p.add_argument("--only", action="append", default=[], metavar="TEXT",
                   help="run only the jobs whose name contains TEXT (repeatable)")
    p.add_argument("--images", type=int, default=None, help="synthetic training images per job "
                   "(default: 10,000 on a GPU)")
    p.add_argument("--out", default=None, help="also write the results here as JSON")
    p.add_argument("--merge", default=None, metavar="FILE",
                   help="also add the results to FILE, the results-gpu.json of benchmarks.gpu.trainer_figures")
    args = p.parse_args(argv)
    if args.device == "cuda":
        found = gpus()
        if not found:
            say("no NVIDIA GPU here (nvidia-smi lists none); run it on a GPU machine, or add --device cpu")
            return 1
        say(f"{len(found)} GPU(s): {found[0]}")
    if not args.no_setup and setup(args.python) != 0:
        say("set-up failed (its error is above)")
        return 1
    quick = args.quick or args.device == "cpu"
    images = args.images or (200 if quick else 10000)
    cfg = dict(device=args.device, arch="lenet" if quick else "resnet18", images=images,
               batch=32 if quick else 128, epochs=1 if quick else 2, timeout=300 if quick else 400)
    py = VENV_PY if os.path.exists(VENV_PY) else sys.executable
    scratch = tempfile.mkdtemp(prefix="gpu-check-")
    results, ok = Results(args.merge, device_name(args.device, py), cfg), True
    try:
        ckpts = {}
        for n, (name, launcher, flags, extra, *images) in enumerate(jobs(cfg)):
            if any(text in name for text in args.skip) or not wanted(args, name):
                continue
            if launcher == "nosearch" and args.device == "cpu":  # cuDNN's choice: GPU only
                continue
            good, ckpts[name] = run_job(py, cfg, scratch, n, name, launcher, flags, extra, results, *images)
            ok &= good
        if args.device == "cuda" and wanted(args, SYNCS_JOB) and not any(t in SYNCS_JOB for t in args.skip):
            ok &= syncs_job(py, cfg, scratch, results)
        if args.device == "cuda" and wanted(args, DIVERGE_JOB):
            ok &= diverge_job(py, cfg, scratch, results)
        if args.device == "cuda" and wanted(args, CUDA_PATHS_JOB):
            ok &= cuda_paths_job(py, cfg, results)
        compiled = ["--amp", "--amp-dtype", "bfloat16", "--compile"]
        resumable = {"horovod": [(HOOKS_BF16, compiled), ("main_horovod.py np=1, gradient hooks on", [])],
                     "ddp": [(DDP_BF16, compiled), ("main_ddp.py np=1 (torchrun)", [])]}
        for port, candidates in resumable.items():
            done = [(ckpts[run], flags) for run, flags in candidates
                    if ckpts.get(run) and os.path.exists(os.path.join(ckpts[run], "ckpt.pth"))]
            if done:  # one resume per port, of its first run that finished
                ckpt, flags = done[0]
                ok &= resume_job(py, cfg, scratch, ckpt, results, port, flags)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    device = results.device
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": device, "config": cfg, "jobs": list(results), "ok": bool(ok)}, f, indent=2)
    say(f"{'all jobs passed' if ok else 'some jobs FAILED'} on {device}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
