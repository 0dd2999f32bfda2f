"""The Slurm tests' cluster and the process controls their stop tests use: scripts/local_slurm.sh
under a name of the test run's own (`Cluster`), what it leaves behind (`assert_nothing_left`,
`down`), and ranks frozen and checked for a pending signal (`frozen`, `signalled`)."""
import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile

from helpers import ROOT, assert_ok, env, is_gone, run, skip_or_fail

SCRIPT = os.path.join(ROOT, "scripts", "local_slurm.sh")


class Cluster:
    """scripts/local_slurm.sh under a name, folder and network of its own, so that it never
    meets a cluster a user (or another test run) has up. The folder is right in /tmp: munged
    refuses a socket below pytest's private (0700) temporary folders."""

    def __init__(self, prefix="s"):
        tag = os.getpid() % 100000
        self.name = f"{prefix}{tag}"
        self.folder = os.path.join(tempfile.gettempdir(), f"test-slurm-{self.name}")
        self.env = {"LOCAL_SLURM_DIR": self.folder, "LOCAL_SLURM_NAME": self.name,
                    "LOCAL_SLURM_NET": f"169.254.{100 + (tag + ord(prefix)) % 150}"}
        self.vars = {}

    def script(self, *args, timeout=120):
        return subprocess.run(["bash", SCRIPT, *args], cwd=ROOT, env=env(self.env), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def up(self, n):
        r = self.script("up", str(n), timeout=600)  # the first up may install Slurm
        if r.returncode == 77:
            skip_or_fail(f"no cluster of network namespaces here: {r.stderr.strip()}")
        assert r.returncode == 0, r.stderr[-3000:]
        self.vars = dict(line.split("=", 1) for line in r.stdout.splitlines())
        self.nodes = self.vars["LOCAL_SLURM_NODES"].split(",")

    def cmd(self, node, *cmd):
        """cmd run on node `node` (1, 2): launch it with env_extra=self.env."""
        return ["bash", SCRIPT, "on", str(node), *map(str, cmd)]

    def on(self, node, *cmd, env_extra=None, timeout=60):
        return run(self.cmd(node, *cmd), timeout=timeout, env_extra=dict(self.env, **(env_extra or {})))

    def sbatch(self, *args, env_extra=None):
        """Submit from node 1 in the project folder, as a user would; returns the job id."""
        r = assert_ok(self.on(1, "sbatch", "--parsable", *args, env_extra=env_extra))
        return int(r.stdout.strip().split(";")[0])

    def show(self, job):
        """`scontrol show job` as {field: value}."""
        r = assert_ok(self.on(1, "scontrol", "--oneliner", "show", "job", job))
        return dict(re.findall(r"(\w+)=(\S*)", r.stdout))

    def jobs(self):
        return assert_ok(self.on(1, "squeue", "--noheader", "--format", "%i %T")).stdout.split("\n")[:-1]


def cluster_pids(folder):
    """{pid: command line} of live processes whose command line or environment names the
    cluster's folder: its daemons (started with LOCAL_SLURM_DIR set) and whatever ran on its
    nodes (SLURM_CONF)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f, open(f"/proc/{pid}/environ", "rb") as g:
                cmd, environ = f.read(), g.read()
        except OSError:
            continue
        if folder.encode() in cmd + environ and not is_gone(int(pid)):
            found[int(pid)] = cmd.replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def assert_nothing_left(c):
    """No namespace, link, process or file of cluster `c` is left."""
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert f"{c.name}-" not in namespaces and f"{c.name}-" not in links, (namespaces, links)
    left = cluster_pids(c.folder)
    assert not left, f"still running: {left}"
    assert not os.path.exists(c.folder), os.listdir(c.folder)


def down(c):
    """`local_slurm.sh down`, then nothing of the cluster may be left; its folder goes either way."""
    try:
        r = c.script("down")
        assert r.returncode == 0, r.stderr
        assert_nothing_left(c)
    finally:  # the test has failed already if anything is left in it
        shutil.rmtree(c.folder, ignore_errors=True)


@contextlib.contextmanager
def frozen(pids):
    """The processes stopped (SIGSTOP) for the block, and continued after it whatever happens.

    A tiny epoch takes well under a second, and Slurm's signal comes some time after the test
    asks for it: with a rank frozen, no rank gets past its next allreduce, so the job cannot
    reach --stop-at and end by itself in between, however fast or slow the machine. A signal
    sent to a stopped process waits for it (on pre-emption Slurm sends SIGCONT, then SIGTERM),
    so the ranks still get what they were sent."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def signalled(pid, signum):
    """Whether the stopped process `pid` has `signum` pending, or was continued (by Slurm, which
    sends SIGCONT right before SIGTERM), or has ended."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return True
    pending = int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)
    return not fields["State"].strip().startswith("T") or bool(pending >> (signum - 1) & 1)
