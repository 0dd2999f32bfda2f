"""What the tests share: tiny synthetic runs of the real trainers, launchers, and the
checks several test modules make. conftest.py holds the fixtures.

Every trainer run is a real subprocess (python, horovodrun, mpirun or torchrun), on the CPU,
with LeNet on a few hundred synthetic images, so the suite stays fast on 2 cores.
The environment they run in, and finding their processes, are testbed/env.py's, which the
benchmarks use too.
"""
import csv
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import torch

from sweeps import flags
from testbed.env import MPI_ENV, env, rank_pids, trainer_pids  # noqa: F401 (the tests' too)
from training.run import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
PY = sys.executable
SYNTH = 500  # training images; test gets 100
# What the tests keep between runs, as `make setup` keeps Horovod's wheel there: real CIFAR-10,
# the container test's Debian base, Inductor's compiled graphs. Each is made anew where missing.
CACHE = os.environ.get("CIFAR_HVD_CACHE", os.path.expanduser("~/.cache/cifar-horovod"))
# Writes real CIFAR-10 from a JPEG pack; it sits beside a clone of the project, not in it.
REAL_DATA_MAKER = os.path.join(os.path.dirname(ROOT), "shared", "data", "make_cifar10.py")
# How a process that aborted (SIGABRT) shows: libstdc++'s last words, or a launcher's report of
# the status (torchrun's -6, horovodrun's 134, mpirun's signal 6).
ABORTED = re.compile(r"terminate called|Fatal Python error: Aborted|exitcode\s*: -6 |"
                     r"exit with status code 134|exited on signal 6|SIGABRT")


# The schedule of a job that a test ends itself (kill, SIGTERM): long enough that the job
# cannot finish on its own between the test's last look and its signal, however slow the
# machine is; a resume of it passes the same number, so the cosine continues.
UNTIL_ENDED = 1000


# Runs across hosts (network namespaces, Slurm nodes) are held against one host's np=2 run with
# one thread per rank on both sides, which makes the two bitwise equal; both stop after epoch 2
# of a 3-epoch schedule (conftest.py's one_host_np2).
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
CLUSTER_EPOCHS = 3


def skip_or_fail(why):
    """Skip a test that this machine cannot run (no root, no network namespaces), in one line;
    under CI (CI=true, or REQUIRE_SYSTEM_TESTS=1 as .ci/run sets) fail it instead: CI's machine
    can run every test, and a skip there would hide the coverage it lost."""
    import pytest
    if os.environ.get("CI") == "true" or os.environ.get("REQUIRE_SYSTEM_TESTS"):
        pytest.fail(f"{why}; CI runs every test (unset CI and REQUIRE_SYSTEM_TESTS to skip it)")
    pytest.skip(why)


def common_args(data_dir, ckpt_dir, *extra, epochs=2, batch=32, lr=0.05):
    return ["--data-dir", str(data_dir), "--dataset", "synthetic", "--synthetic-size", str(SYNTH),
            "--arch", "lenet", "--epochs", str(epochs), "--batch-size", str(batch),
            "--lr", str(lr), "--checkpoint-dir", str(ckpt_dir), *map(str, extra)]


def parse(*argv, port=None):
    """A trainer's parsed and checked flags, in process: main.py's, or with port="horovod",
    "elastic", "ddp" or "sweep" that trainer's."""
    if port == "sweep":
        return flags.parse_args("", [str(a) for a in argv])
    parser = cli.build_parser("")
    if port:
        getattr(cli, f"add_{port}_args")(parser)
    return cli.parse_args(parser, [str(a) for a in argv])


def without_lr(args):
    """The same flags without --lr, so that a resume continues the saved schedule."""
    i = args.index("--lr")
    return args[:i] + args[i + 2:]


def run(cmd, timeout=300, env_extra=None, **kw):
    return subprocess.run(cmd, cwd=ROOT, env=env(env_extra), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, **kw)


def run_main(args, **kw):
    return run([PY, "main.py", *map(str, args)], **kw)


def horovod_cmd(np_, args, launcher="mpirun", probe=None, script="main_horovod.py"):
    """main_horovod.py under a real launcher: mpirun with the shipped hostfile (the default:
    horovodrun spends about 3.5 s more a launch, in its own check that imports torch; tests that
    are about horovodrun or gloo say so), horovodrun --gloo/--mpi, or plain python.

    With probe=DIR, every rank also saves its final model and history to DIR/rank<r>.pt.
    """
    cmd = probe_cmd("rank_horovod", probe) if probe else [PY, script]
    cmd += list(map(str, args))
    if launcher == "python":
        return cmd
    if launcher == "mpirun":
        more = ["--oversubscribe"] if np_ > 2 else []  # the hostfile has 2 slots
        return ["mpirun", "-np", str(np_), "--hostfile", os.path.join(ROOT, "hostfile"), *more,
                "--bind-to", "none", "-x", "PATH", "-x", "PYTHONUNBUFFERED", *cmd]
    return [os.path.join(BIN, "horovodrun"), "-np", str(np_), f"--{launcher}", *cmd]


def run_horovod(np_, args, launcher="mpirun", probe=None, **kw):
    return run(horovod_cmd(np_, args, launcher, probe), **kw)


def ddp_cmd(np_, args, probe=None, launcher="torchrun", torchrun_args=("--standalone",)):
    """main_ddp.py under torchrun (a free port of its own with --standalone), or plain python.

    With probe=DIR, every rank also saves its final model and history to DIR/rank<r>.pt.
    """
    cmd = probe_cmd("rank_ddp", probe) if probe else [PY, "main_ddp.py"]
    cmd += list(map(str, args))
    if launcher == "python":
        return cmd
    return [os.path.join(BIN, "torchrun"), *torchrun_args, "--nproc_per_node", str(np_), *cmd[1:]]


def run_ddp(np_, args, probe=None, launcher="torchrun", **kw):
    return run(ddp_cmd(np_, args, probe, launcher), **kw)


def elastic_cmd(slots_file, np_, min_np, max_np, args, gloo_timeout=None):
    """main_elastic.py under horovodrun's elastic driver on this host, its slots read from
    slots_file by scripts/discover_hosts.sh. The interface is named, or the driver waits for
    a second host to find one."""
    discover = os.path.join(ROOT, "scripts", "discover_hosts.sh")
    cmd = [os.path.join(BIN, "horovodrun"), "-np", str(np_), "--min-np", str(min_np), "--max-np", str(max_np),
           "--host-discovery-script", f"{discover} {slots_file}", "--network-interface", "lo"]
    if gloo_timeout:
        cmd += ["--gloo-timeout-seconds", str(gloo_timeout)]
    return cmd + [PY, "main_elastic.py", *map(str, args)]


def assert_ok(r):
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    return r


def load_ranks(probe, size):
    return [torch.load(os.path.join(probe, f"rank{r}.pt"), map_location="cpu", weights_only=True)
            for r in range(size)]


def assert_states_equal(got, want, what="", atol_scale=0.0):
    """Two state dicts hold the same keys and bitwise equal tensors; with atol_scale, equal
    within that fraction of the largest magnitude of each of want's tensors instead."""
    assert got.keys() == want.keys(), f"{what}: keys differ"
    for k, w in want.items():
        if atol_scale:
            scale = max(w.abs().max().item(), 1e-12)
            assert (got[k] - w).abs().max().item() <= atol_scale * scale, f"{what}: {k} differs"
        else:
            assert torch.equal(got[k], w), f"{what}: {k} differs"


def assert_ranks_identical(ranks):
    """Every rank of a probed job (load_ranks) ended with rank 0's model, bitwise."""
    for r, other in enumerate(ranks[1:], 1):
        assert_states_equal(ranks[0]["model"], other["model"], f"rank 0 and rank {r}")


def probe_cmd(name, *args):
    """A probe: a small program in tests/probes/ that a test runs in a process of its own."""
    return [PY, os.path.join(ROOT, "tests", "probes", f"{name}.py"), *map(str, args)]


def read_metrics(ckpt_dir):
    with open(os.path.join(ckpt_dir, "metrics.csv")) as f:
        return list(csv.DictReader(f))


def load_ckpt(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def last_line(text):
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def parse_eval(line):
    fields = dict(kv.split("=") for kv in line.split())
    return float(fields["test_loss"]), float(fields["test_acc"]), int(fields["images"])


def assert_one_line_error(result, *needles, code=None):
    """A clean failure: non-zero exit, no traceback, one error line naming the problem."""
    assert result.returncode != 0, result.stdout
    if code is not None:
        assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if "error" in ln.lower()]
    assert errors, result.stderr
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])


# ---------------------------------------------------------------------------
# Jobs in the background, and their processes

class Job:
    """A launched job in its own process group, its output in a file. The `jobs`
    fixture kills every job a test started, also when the test fails."""

    def __init__(self, cmd, log_path, env_extra=None):
        self.cmd, self.log_path = cmd, log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env(env_extra), stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)

    def output(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def wait(self, timeout):
        """The exit status; a job still running after `timeout` seconds is killed and fails the test."""
        import pytest
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"job still running after {timeout}s: {self.cmd}\n{self.output()[-4000:]}")
        finally:
            self.log.close()

    def signal(self, sig):
        """Send `sig` to the launcher process alone."""
        os.kill(self.proc.pid, sig)

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group this job started, and only it
            self.proc.wait()


def wait_until(check, timeout, what, job=None, interval=0.1):
    """Poll check() until it returns something true; fail the test after `timeout` seconds,
    or as soon as `job` has ended."""
    import pytest
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if job is not None and job.proc.poll() is not None:
            got = check()
            if got:
                return got
            pytest.fail(f"job ended (status {job.proc.returncode}) before {what}:\n{job.output()[-4000:]}")
        time.sleep(interval)
    if job is not None:
        job.kill()
    pytest.fail(f"no {what} after {timeout}s" + (f":\n{job.output()[-4000:]}" if job else ""))


def assert_the_diff_is_the_port(port, tag, cap=40):
    """`diff main.py <port>` shows only the port: at most `cap` changed lines, each block of
    them says why in a `tag` comment line of its own (as in Horovod's examples: no trailing
    tag comments, so no sentence runs across them), no line is over 100 characters, and the
    port has main.py's functions in main.py's order (its own may follow them)."""
    blocks = diff_blocks("main.py", port)
    assert sum(len(old) + len(new) for old, new in blocks) <= cap
    untagged = [new for old, new in blocks if not any(ln.lstrip().startswith(tag) for ln in new)]
    assert not untagged, f"every changed block says why on a '{tag}' line above it: {untagged}"
    trailing = [ln for _, new in blocks for ln in new if tag in ln and not ln.lstrip().startswith(tag)]
    assert not trailing, f"'{tag}' comments stand on their own lines: {trailing}"
    text = open(os.path.join(ROOT, port)).read()
    assert not [ln for ln in text.splitlines() if len(ln) > 100], f"{port}: lines over 100 characters"
    names = [re.findall(r"^def (\w+)", open(os.path.join(ROOT, f)).read(), re.M) for f in ("main.py", port)]
    assert names[1][:len(names[0])] == names[0]


def diff_blocks(a, b):
    """`diff a b` as blocks: (lines taken out of a, lines put in b) per change."""
    out = subprocess.run(["diff", a, b], cwd=ROOT, capture_output=True, text=True).stdout
    blocks = []
    for line in out.splitlines():
        if re.match(r"^\d", line):
            blocks.append(([], []))
        elif line.startswith(("<", ">")):
            blocks[-1][line.startswith(">")].append(line[2:])
    return blocks


def metrics_rows(ckpt_dir):
    """metrics.csv's rows, or [] while it does not exist yet."""
    try:
        return read_metrics(ckpt_dir)
    except OSError:
        return []


def kill_rank_and_wait(job, script, marker, rank=1, within=30):
    """SIGKILL one rank of a running two-rank job and wait for the whole job to end; fail the
    test unless it ended within `within` seconds, non-zero, with no rank left. Returns {rank: pid}."""
    pids = rank_pids(script, marker)
    assert set(pids) == {0, 1}, pids
    os.kill(pids[rank], signal.SIGKILL)
    t_kill = time.monotonic()
    rc = job.wait(timeout=within)  # fails the test if the job is still running
    assert time.monotonic() - t_kill < within and rc != 0
    assert all(is_gone(pid) for pid in pids.values()), "a rank is still running"
    return pids


def is_gone(pid):
    """The process has exited (a zombie waiting for its parent counts)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[1].split()[0] == "Z"
    except OSError:
        return True


def readme_blocks(heading, doc="README.md"):
    """The non-empty lines of each ```bash block in the section `heading` of `doc` (a path from
    the repository's root), in order."""
    with open(os.path.join(ROOT, doc)) as f:
        text = f.read()
    section = text[text.index(heading + "\n") + len(heading):]
    section = section[:section.find("\n## ")] if "\n## " in section else section
    return [[ln for ln in body.splitlines() if ln.strip()] for body in re.findall(r"```bash\n(.*?)```", section, re.S)]


# ---------------------------------------------------------------------------
# Hosts of network namespaces (scripts/local_cluster.sh)

CLUSTER_SCRIPT = os.path.join(ROOT, "scripts", "local_cluster.sh")
CLUSTER_JOB_TIMEOUT = 150  # seconds for one launch, ssh included, on a busy machine


class LocalCluster:
    """scripts/local_cluster.sh with its state in `folder`, under a name of its own, so
    that it never meets a cluster a user (or another test run) has up."""

    def __init__(self, folder):
        self.env = {"CLUSTER_DIR": str(folder), "CLUSTER_NAME": f"t{os.getpid() % 100000}"}
        self.vars = {}

    def script(self, *args, timeout=300):
        return subprocess.run(["bash", CLUSTER_SCRIPT, *args], cwd=ROOT, env=env(self.env), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def up(self, n, *options):
        """`up n` with its options (--slots, --rate); a machine without namespaces skips."""
        r = self.script("up", str(n), *map(str, options))
        if r.returncode == 77:
            skip_or_fail(f"no cluster of network namespaces here: {r.stderr.strip()}")
        assert r.returncode == 0, r.stderr[-3000:]
        for line in r.stdout.splitlines():  # NAME=value, or NAME=(bash array)
            name, _, value = line.partition("=")
            words = shlex.split(value.strip("()"))
            self.vars[name] = words if value.startswith("(") else (words[0] if words else "")  # RATE= unshaped
        self.addresses = [h.split(":")[0] for h in self.vars["CLUSTER_HOSTS"].split(",")]

    def on(self, host, cmd):
        """cmd run on host `host`, as a command line; launch it with env_extra=self.env."""
        return ["bash", CLUSTER_SCRIPT, "on", str(host), *map(str, cmd)]

    def launch(self, launcher, np_, args, probe=None, hosts=None, script="main_horovod.py"):
        """A launcher on host 1 that starts np_ ranks over the cluster's hosts."""
        cmd = probe_cmd("rank_horovod", probe) if probe else [PY, os.path.join(ROOT, script)]
        cmd += list(args)
        if launcher == "mpirun":
            cmd = ["mpirun", "-np", np_, "--hostfile", self.vars["CLUSTER_HOSTFILE"],
                   *self.vars["CLUSTER_MPIRUN_ARGS"], *cmd]
        else:
            cmd = [os.path.join(BIN, "horovodrun"), "-np", np_, "-H", hosts or self.vars["CLUSTER_HOSTS"],
                   *self.vars["CLUSTER_HOROVODRUN_ARGS"], f"--{launcher}", *cmd]
        return self.on(1, cmd)

    def run(self, *launch_args, **kw):
        return run(self.launch(*launch_args, **kw), timeout=CLUSTER_JOB_TIMEOUT,
                   env_extra=dict(self.env, **ONE_THREAD))

    def down(self):
        """`down`, then nothing of the cluster left: no namespace, no link (and so no queue
        discipline on one)."""
        r = self.script("down", timeout=120)
        assert r.returncode == 0, r.stderr
        name = self.env["CLUSTER_NAME"] + "-"
        for what in (["ip", "netns", "list"], ["ip", "-o", "link", "show"], ["tc", "qdisc", "show"]):
            left = subprocess.run(what, capture_output=True, text=True).stdout
            assert name not in left, (what, left)
