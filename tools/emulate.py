"""Emulate a GPU cluster's data-parallel training on this machine, and print the step time and
efficiency it measures beside the scaling model's prediction. Needs root (network namespaces).

    python -m tools.emulate --hosts 4 --rate 100gbit --arch resnet18 --batch 128 --step-ms 2.70
    python -m tools.emulate --hosts 2 --rate 400mbit --arch lenet --batch 64 --port ddp

It brings up --hosts namespace hosts with sshd (scripts/local_cluster.sh, a cluster of its own
name) whose links carry --rate, starts one rank per host with the real port (Horovod's
DistributedOptimizer under horovodrun --gloo, or DDP over gloo under one torchrun per host),
and removes the hosts again, also when something fails. Each rank holds the real model's
parameters, and every layer's forward and backward sleeps the time a layer profile gives it
(tools/emulated_rank.py), so gradients reach the port's hooks when a GPU would make them; the
allreduce is real. --step-ms scales the profile to one GPU's step time (forward, backward,
optimizer); without it the layers take what they take on this machine's CPU.

It is a simulation: the allreduce runs over gloo's ring on TCP between namespaces, not NCCL's
algorithms over NVLink and InfiniBand, and nothing contends for a GPU between the allreduce
and compute. Time is dilated by a factor D (--dilation, chosen by default so that the links
carry at most EMULATE_LINK_BUDGET bits per second altogether, see DILATION below): link rates
divided by D, compute and Horovod's cycle time multiplied by D, so that a fast cluster's
ratios fit on a few cores; software costs that do not scale (a message's latency, Python's
overhead) shrink by D in the results.

With --gpus-per-host G each host stands for a node of G GPUs that compute in step: its link
carries what a flat ring of hosts x G GPUs sends across a node's link, 2 (NG - 1) / NG times
the gradients, by a rate lowered in proportion; NVLink inside the node is taken as free.

Settings (environment): EMULATE_NET (the hosts' 169.254.X network, default 169.254.93),
EMULATE_SSH_PORT (default 2293), EMULATE_LINK_BUDGET (bits/s over all links, default 800e6).
"""
import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import models
from tools import layer_profile, scaling_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "local_cluster.sh")
BIN = os.path.dirname(sys.executable)
IFACE = "cluster0"  # local_cluster.sh's interface on every host
# The links' rates added up, in bits per second of real time, that the emulator aims for: the
# ranks' CPU for the allreduce grows with it (docs/PERFORMANCE.md says how much).
LINK_BUDGET_BPS = float(os.environ.get("EMULATE_LINK_BUDGET", 800e6))
# A Horovod rank's background thread spent about 1 ms of CPU a cycle at 8 ranks: the ranks'
# cycles together at most one every 8 ms of real time take about 0.15 of a core.
CYCLES_APART_S = 8e-3
PROFILE_BATCH = 32  # with --step-ms, the CPU profile's proportions come from this batch at most


class Failed(Exception):
    """A failure the command reports in one line, exit status 1."""
    code = 1


class Usage(Failed):
    """A wrong flag: exit status 2, as argparse uses."""
    code = 2


# ============================================================================
# Rates, dilation, the plan

def parse_rate(text):
    """bits/s from tc's form: a number and kbit, mbit or gbit (e.g. 100gbit, 400mbit)."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([kmg])bit", text.strip().lower())
    if not m:
        raise Usage(f"--rate takes a rate as tc does, a number and kbit, mbit or gbit (e.g. 100gbit), "
                     f"not '{text}'")
    return float(m.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def ring_share(hosts, gpus_per_host):
    """What a host's link carries in a flat ring of hosts x G GPUs, over what it carries in a
    ring of the hosts alone: the factor the emulated link's rate is lowered by."""
    n = hosts * gpus_per_host
    return (2 * (n - 1) / n) / (2 * (hosts - 1) / hosts)


def dilation(rate_bps, hosts, gpus_per_host=1, budget_bps=None):
    """(D, the shaped rate of each link in bits/s): D so that the hosts' links together carry
    at most the budget, and Horovod's cycles of all ranks together come at most every
    CYCLES_APART of real time."""
    budget = budget_bps or LINK_BUDGET_BPS
    effective = rate_bps / ring_share(hosts, gpus_per_host)
    d = max(effective * hosts / budget, hosts * CYCLES_APART_S / scaling_model.CYCLE_S)
    return d, effective / d


def case(name, profile, k=1, fp16=False, compiled=False, steps=5, warmup=2, hierarchical=False):
    """One case of a plan (tools/emulated_rank.py): a profile and the port's flags."""
    return {"name": name, "profile": profile, "k": k, "fp16": fp16, "compiled": compiled,
            "steps": steps, "warmup": warmup, "hierarchical": hierarchical}


def model_point(profile, hosts, rate_bps, port="horovod", k=1, fp16=False, compiled=False, fusion=True,
                gpus_per_host=1, hierarchical=False):
    """The scaling model's point for an emulated case (rate_bps: the emulated link's). A
    hierarchical case runs gpus_per_host ranks a host, the steps inside it over the host's
    loopback, unshaped (taken as free), in 3 collectives (emulated_rank.Composed)."""
    point = dict(n=hosts * gpus_per_host, rate_bps=rate_bps, tensors=gradient_bytes(profile),
                 compute_s=profile["step_s"], backward_s=profile["backward_s"],
                 ready=layer_profile.ready_times(profile, compiled == "regions"), k=k, fp16=fp16,
                 compiled=compiled, fusion=fusion, port=port)
    return dict(point, nodes=hosts, intra_bps=None, composed=True) if hierarchical else point


def gradient_bytes(profile):
    """Every gradient tensor's fp32 bytes, in the model's parameter order."""
    by_name = {n: b for layer in profile["layers"] for n, b in zip(layer["params"], layer["bytes"])}
    net = models.get_model(profile["arch"], num_classes=10)
    return [by_name[n] for n, p in net.named_parameters() if p.requires_grad]


# ============================================================================
# The hosts and the launch

class Hosts:
    """`hosts` namespace hosts whose links carry shaped_bps each way (scripts/local_cluster.sh),
    under a name, network and folder of their own; up for a `with` block, and down after it
    however it ended."""

    def __init__(self, hosts, shaped_bps, folder, slots=1):
        self.n, self.slots = hosts, slots
        self.rate = f"{max(1, round(shaped_bps / 1e3))}kbit"
        self.env = dict(os.environ, CLUSTER_DIR=os.path.join(folder, "hosts"),
                        CLUSTER_NAME=f"emu{os.getpid() % 1000000}",
                        CLUSTER_NET=os.environ.get("EMULATE_NET", "169.254.93"),
                        CLUSTER_SSH_PORT=os.environ.get("EMULATE_SSH_PORT", "2293"),
                        PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
        self.vars = {}

    def script(self, *args, timeout=600):
        return subprocess.run(["bash", SCRIPT, *args], cwd=ROOT, env=self.env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def __enter__(self):
        try:
            r = self.script("up", str(self.n), "--slots", str(self.slots), "--rate", self.rate)
        except BaseException:
            self.script("down", timeout=300)
            raise
        if r.returncode:
            self.script("down", timeout=300)
            last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"status {r.returncode}"
            raise Failed(f"could not bring up {self.n} namespace hosts: {last}")
        for line in r.stdout.splitlines():
            name, _, value = line.partition("=")
            self.vars[name] = shlex.split(value.strip("()")) if value.startswith("(") else value
        return self

    def __exit__(self, *exc):
        self.script("down", timeout=300)

    def on(self, host, cmd):
        return ["bash", SCRIPT, "on", str(host), *map(str, cmd)]

    def first(self, n):
        """The first n hosts, for launch(): the same hosts, a smaller job."""
        view = Hosts(n, 0, "", self.slots)
        view.env = self.env
        view.vars = dict(self.vars, CLUSTER_HOSTS=",".join(self.vars["CLUSTER_HOSTS"].split(",")[:n]))
        return view


def rank_env(dilation_, fusion, cycle_s=scaling_model.CYCLE_S):
    """The emulated ranks' environment: Horovod's cycle (cycle_s) dilated, its stall warnings
    off (a dilated step may last minutes), fusion on or off."""
    env = {"HOROVOD_CYCLE_TIME": f"{cycle_s * 1e3 * dilation_:g}", "HOROVOD_STALL_CHECK_DISABLE": "1"}
    if not fusion:
        env["HOROVOD_FUSION_THRESHOLD"] = "0"
    return env


def launch(hosts, port, script, env_extra, timeout, work):
    """Run `script` (what follows `python`: a file and its flags, or -m and a module) as a rank
    on each host's slot under the port's launcher: horovodrun --gloo from host 1 ("horovod"), Open
    MPI's mpirun from host 1 ("mpirun", which passes env_extra's OMPI_MCA_ settings on), or a
    torchrun on every host meeting at host 1 ("ddp"). Returns host 1's launcher's output; a
    failure or a run past `timeout` seconds raises Failed, after every rank has been ended."""
    if port == "horovod":
        cmds = [hosts.on(1, [os.path.join(BIN, "horovodrun"), "-np", hosts.n * hosts.slots,
                             "-H", hosts.vars["CLUSTER_HOSTS"], *hosts.vars["CLUSTER_HOROVODRUN_ARGS"], "--gloo",
                             sys.executable, *script])]
    elif port == "mpirun":
        cmds = [hosts.on(1, ["mpirun", "-np", hosts.n * hosts.slots, "-H", hosts.vars["CLUSTER_HOSTS"],
                             *hosts.vars["CLUSTER_MPIRUN_ARGS"], "-x", "PYTHONPATH", sys.executable, *script])]
    else:
        address = hosts.vars["CLUSTER_HOSTS"].split(",")[0].split(":")[0]
        cmds = [hosts.on(i + 1, [os.path.join(BIN, "torchrun"), "--nnodes", hosts.n, "--node_rank", i,
                                 "--nproc_per_node", 1, "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                 f"{address}:29400", "--rdzv-id", "emulate", *script])
                for i in range(hosts.n)]
    env = dict(hosts.env, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=IFACE,
               **env_extra)
    logs = [open(os.path.join(work, f"launch{i}.log"), "w+") for i in range(len(cmds))]
    procs = []
    try:
        for cmd, log in zip(cmds, logs):
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        deadline = time.monotonic() + timeout
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        logs[0].seek(0)
        output = logs[0].read()
        if any(p.returncode for p in procs):
            raise Failed(f"the job failed (status {[p.returncode for p in procs]}):\n{output[-3000:]}")
        return output
    except subprocess.TimeoutExpired:
        raise Failed(f"the job ran past {timeout:.0f} s; fewer --steps or a smaller --dilation") from None
    finally:
        ended = False
        for p in procs:  # each launcher's session, which this function started
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                ended = True
        if ended:  # ranks that the launchers started over ssh, on the hosts
            hosts.script("reap", timeout=120)
        for log in logs:
            log.close()


def run_plan(hosts, port, cases, dilation_, fusion=True, timeout=1800, cycle_s=scaling_model.CYCLE_S):
    """Run `cases` in one job on the hosts under `port` ("horovod" or "ddp"), Horovod's cycle
    `cycle_s` (undilated): rank 0's results."""
    work = tempfile.mkdtemp(prefix="plan-", dir=os.path.dirname(hosts.env["CLUSTER_DIR"]))
    try:
        plan, out = os.path.join(work, "plan.json"), os.path.join(work, "out.json")
        with open(plan, "w") as f:
            json.dump({"dilation": dilation_, "cases": cases}, f)
        launch(hosts, port, ["-m", "tools.emulated_rank", "--port", port, "--plan", plan, "--out", out],
               rank_env(dilation_, fusion, cycle_s), timeout, work)
        with open(out) as f:
            return json.load(f)["cases"]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def cpu_share(result, cores=None):
    """The share of this machine's cores the ranks used together while the steps were timed."""
    cores = cores or len(os.sched_getaffinity(0))
    return sum(result["cpu_s"]) / (result["wall_s"] * cores)


# ============================================================================
# The command

class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Usage(f"{message} (see --help)")


def parse_args(argv):
    p = _Parser(prog="python -m tools.emulate", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=2, help="emulated hosts, one rank each (default: %(default)s)")
    p.add_argument("--rate", default="100gbit", help="the emulated link rate between hosts, tc's form "
                   "(default: %(default)s)")
    p.add_argument("--arch", default="resnet18", type=str.lower, help="a model of models.MODELS (default: %(default)s)")
    p.add_argument("--batch", type=int, default=128, help="images per rank and pass (default: %(default)s)")
    p.add_argument("--step-ms", type=float, default=None,
                   help="one GPU's step time (forward, backward, optimizer) at --batch, split over the layers "
                        "by this machine's CPU profile (default: the CPU's own times)")
    p.add_argument("--port", choices=("horovod", "ddp"), default="horovod", help="(default: %(default)s)")
    p.add_argument("--fp16-allreduce", action="store_true", help="Horovod's fp16 compression")
    p.add_argument("--batches-per-allreduce", type=int, default=1, metavar="K",
                   help="backward passes per allreduce (default: %(default)s)")
    p.add_argument("--compile", nargs="?", const="whole", choices=("whole", "regions"), default=None,
                   help="the backward pass compiled: as one graph, every gradient ready at its end "
                        "(--compile, or --compile whole), or block by block, each block's gradients "
                        "ready at its end (--compile regions: the Horovod port's --grad-allreduce "
                        "regions)")
    p.add_argument("--fusion-off", action="store_true", help="Horovod's fusion off (HOROVOD_FUSION_THRESHOLD=0)")
    p.add_argument("--gpus-per-host", type=int, default=1, metavar="G",
                   help="each host a node of G GPUs computing in step (default: %(default)s)")
    p.add_argument("--dilation", type=float, default=None, metavar="D",
                   help="the time dilation (default: chosen from EMULATE_LINK_BUDGET)")
    p.add_argument("--steps", type=int, default=5, help="timed steps, after 2 warm-up ones (default: %(default)s)")
    p.add_argument("--profile", metavar="FILE", help="a layer profile (python -m tools.layer_profile --json) "
                   "instead of profiling here")
    p.add_argument("--json", metavar="FILE", help="also write the figures to FILE")
    args = p.parse_args(argv)
    if args.arch not in models.MODELS:
        p.error(f"unknown --arch {args.arch}; one of {', '.join(sorted(models.MODELS))}")
    if not 2 <= args.hosts <= 64:
        p.error(f"--hosts must be from 2 to 64, not {args.hosts}")
    if args.batch < 1 or args.steps < 1 or args.batches_per_allreduce < 1 or args.gpus_per_host < 1:
        p.error("--batch, --steps, --batches-per-allreduce and --gpus-per-host must be positive")
    if args.step_ms is not None and args.step_ms <= 0 or args.dilation is not None and args.dilation < 1:
        p.error("--step-ms must be positive and --dilation at least 1")
    if args.port == "ddp" and (args.fp16_allreduce or args.fusion_off):
        p.error("--fp16-allreduce and --fusion-off are Horovod's; drop them with --port ddp")
    if args.port == "ddp" and args.compile == "regions":
        p.error("--compile regions is the Horovod port's; DDP's compiled wrapper is split at its buckets")
    args.rate_bps = parse_rate(args.rate)
    args.compiled = {None: False, "whole": True, "regions": "regions"}[args.compile]
    return args


def profile_for(args):
    """The layer profile the ranks sleep: a file, or measured here (one thread), then scaled to
    --step-ms."""
    if args.profile:
        try:
            with open(args.profile) as f:
                prof = json.load(f)
        except (OSError, ValueError) as e:
            raise Failed(f"cannot read the --profile {args.profile}: {e}") from None
        if prof.get("arch") != args.arch:
            raise Failed(f"--profile {args.profile} is of {prof.get('arch')}, not --arch {args.arch}")
    else:
        import torch
        torch.set_num_threads(1)
        batch = min(args.batch, PROFILE_BATCH) if args.step_ms else args.batch
        prof = layer_profile.measure(args.arch, batch)
    if args.step_ms:
        prof = layer_profile.scaled(prof, args.step_ms / 1e3, f"a step of {args.step_ms:g} ms at batch {args.batch}")
    return prof


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv)
        if os.geteuid() != 0:
            raise Failed("must run as root, to make network namespaces (sudo -E python -m tools.emulate ...)")
        return emulate(args)
    except Failed as e:
        print(f"python -m tools.emulate: error: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("python -m tools.emulate: stopped; the hosts are down", file=sys.stderr)
        return 130


def _stop(signum, frame):
    raise KeyboardInterrupt  # so that the hosts come down on the way out


def emulate(args):
    signal.signal(signal.SIGTERM, _stop)
    prof = profile_for(args)
    d, shaped = dilation(args.rate_bps, args.hosts, args.gpus_per_host)
    if args.dilation:
        d, shaped = args.dilation, args.rate_bps / ring_share(args.hosts, args.gpus_per_host) / args.dilation
    fusion = not args.fusion_off
    point = model_point(prof, args.hosts, args.rate_bps, args.port, args.batches_per_allreduce, args.fp16_allreduce,
                        args.compiled, fusion, args.gpus_per_host)
    predicted = scaling_model.step_s(point, scaling_model.FITTED)
    wall = predicted * d * (args.steps + 2) * 1.5 + 120
    n_gpus = args.hosts * args.gpus_per_host
    print(f"emulating {n_gpus} GPUs on {args.hosts} namespace hosts"
          + (f" ({args.gpus_per_host} a host)" if args.gpus_per_host > 1 else "")
          + f", links of {args.rate}; {args.arch}, batch {args.batch}, {args.port}"
          + "".join(f", {f}" for f, on in (("--fp16-allreduce", args.fp16_allreduce),
                                             (f"--batches-per-allreduce {args.batches_per_allreduce}",
                                              args.batches_per_allreduce > 1),
                                             (f"--compile {args.compile}", args.compile),
                                             ("fusion off", args.fusion_off)) if on),
          flush=True)
    print(f"layer times: {prof['source']}; time dilated {d:g}x (links shaped to {shaped / 1e6:.3g} Mbit/s), "
          f"about {wall / 60:.0f} min at most", flush=True)
    cases = [case("cli", prof, args.batches_per_allreduce, args.fp16_allreduce, args.compiled, args.steps)]
    folder = tempfile.mkdtemp(prefix="cifar-emulate-")
    try:
        with Hosts(args.hosts, shaped, folder) as hosts:
            result = run_plan(hosts, args.port, cases, d, fusion, timeout=wall)[0]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    k = args.batches_per_allreduce
    measured_eff = k * prof["step_s"] / result["step_s"]
    error = (predicted - result["step_s"]) / result["step_s"]
    print(f"step {result['step_s'] * 1e3:.3g} ms (compute {k * prof['step_s'] * 1e3:.3g} ms): efficiency "
          f"{measured_eff:.3f} (1.0 = {n_gpus} x one GPU's images/s)")
    print(f"model: step {predicted * 1e3:.3g} ms, efficiency {k * prof['step_s'] / predicted:.3f} "
          f"(error {error:+.1%})")
    print(f"the ranks used {cpu_share(result):.2f} of this machine's {len(os.sched_getaffinity(0))} cores while "
          f"timed; at most {max(result['rss_mb']):.0f} MB of memory a rank")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k_: v for k_, v in vars(args).items()}, "dilation": d, "shaped_bps": shaped,
                       "profile": prof, "result": result, "predicted_step_s": predicted,
                       "efficiency": measured_eff, "model_error": error, "cpu_share": cpu_share(result)}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
