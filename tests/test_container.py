"""The container image: the container commands of README and docs/INSTALL.md, in a tiny form, with podman.

No image registry is reachable, so the base is made here: Debian's minbase with Python
(mmdebstrap, kept in the tests' cache for the week, imported into podman) and the pinned PyTorch
from uv's cache. That PyTorch is mounted read-only at the base's site folder, in the build and in
every container, instead of being copied into the base, which would add 5.9 GB and about two and
a half minutes; to the Dockerfile it is the base's PyTorch all the same. `make image` builds on that base with the
Horovod wheel `make setup` cached. Then, as those commands say: `horovodrun -np 2` in one container as
an arbitrary UID, a resume in a second container, and `mpirun` from a container on one host of
scripts/local_cluster.sh to a container running sshd on the other, which must train bitwise
what one container trained. And the jobs of deploy/kubernetes as the operators would run them:
each pod a container on a namespace host of its own, as the manifest's UID, with the manifest's
command and what the operator gives the pod (the MPIJob's hostfile, ssh key files and variables;
the PyTorchJob's rendezvous variables): each trains, and the MPIJob's restarted launcher resumes
from the claim's folder.

Everything podman makes lives under the module's own storage folder (--root), removed at the
end, also when a test fails. Needs root; installs podman, runc and mmdebstrap from Debian when
they are missing.
"""
import glob
import hashlib
import os
import pathlib
import shlex
import shutil
import subprocess
import tempfile
import time

import pytest

from helpers import (
    CACHE,
    PY,
    ROOT,
    UNTIL_ENDED,
    LocalCluster,
    assert_states_equal,
    env,
    load_ckpt,
    read_metrics,
    readme_blocks,
    skip_or_fail,
    wait_until,
)
from test_kubernetes import job, pods, render

HEADING = "## Run in a container"
UID = 4242  # no such user in the image: it must run as any UID
CLUSTER = {"CLUSTER_NAME": f"k{os.getpid() % 100000}", "CLUSTER_NET": "169.254.79"}
PYVER = "3.11"  # Debian bookworm's Python, the base's
SITE = f"/usr/local/lib/python{PYVER}/dist-packages"
TINY = ["--dataset", "synthetic", "--synthetic-size", "200", "--arch", "lenet", "--batch-size", "32"]


def sh(cmd, timeout=300, **kw):
    # A session of its own: mmdebstrap, on a failure, sends SIGHUP to its whole process group,
    # which would otherwise be pytest's.
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          start_new_session=True, **kw)


def assert_ran(r):
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    return r


def pins():
    with open(os.path.join(ROOT, "requirements.txt")) as f:
        return [ln.strip() for ln in f if ln.startswith(("torch==", "torchvision=="))]


class Podman:
    """podman with its storage and state in `folder`, runc and cgroupfs (crun and systemd's
    cgroups do not work on every host), and no default ulimits (setrlimit fails in some
    sandboxes)."""

    def __init__(self, folder):
        self.folder = folder
        conf = folder / "containers.conf"
        conf.write_text("[containers]\ndefault_ulimits = []\n")
        self.env = env({"CONTAINERS_CONF": str(conf)})
        self.argv = ["podman", "--root", str(folder / "storage"), "--runroot", str(folder / "run"),
                     "--tmpdir", str(folder / "tmp"), "--runtime", shutil.which("runc"),
                     "--cgroup-manager", "cgroupfs"]

    def __call__(self, *args, timeout=300, netns=None):
        cmd = [*self.argv, *args]
        if netns:
            cmd = ["nsenter", f"--net=/run/netns/{netns}", *cmd]
        return sh(cmd, timeout=timeout, env=self.env)

    def remove_everything(self):
        """Every container and image of this storage, then the storage itself; the system's own
        podman storage, networks and settings are not touched."""
        self("rm", "--all", "--force", "--time", "0", timeout=120)
        self("rmi", "--all", "--force", timeout=120)
        with open("/proc/self/mounts") as f:
            left = [m.split()[1] for m in f if m.split()[1].startswith(str(self.folder))]
        for m in sorted(left, key=len, reverse=True):  # storage/overlay is a mount of its own
            sh(["umount", m])
        shutil.rmtree(self.folder)


def install_missing():
    """Debian's packages of the same names as the commands, where a command is missing."""
    missing = [tool for tool in ("podman", "runc", "mmdebstrap") if not shutil.which(tool)]
    if missing:
        apt = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for cmd in (["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]):
            r = sh(cmd, timeout=600, env=apt)
            assert r.returncode == 0, f"{' '.join(cmd)} failed: {r.stderr[-2000:]}"


@pytest.fixture(scope="module")
def podman(request):
    if os.geteuid() != 0:
        skip_or_fail("the container tests need root (podman's storage, runc and network namespaces)")
    install_missing()
    # Right in /tmp: podman refuses a run root longer than 50 characters, which pytest's
    # temporary folders (under a worker's own, with -n) exceed.
    p = Podman(pathlib.Path(tempfile.mkdtemp(prefix="podman-")))
    request.addfinalizer(p.remove_everything)
    return p


def debian_base():
    """Debian's minbase with Python as a tar file (mmdebstrap, 35 s on 2 cores), kept in the tests'
    cache for the week: a new week or recipe makes it anew, removing the old and any half-made."""
    # The host's certificate authorities, so that pip in the build trusts what the host's does.
    hook = 'cp /etc/ssl/certs/ca-certificates.crt "$1/etc/ssl/certs/ca-certificates.crt"'
    make = ["mmdebstrap", "--quiet", "--variant=minbase", "--include=python3,python3-venv,python3-pip,ca-certificates",
            f"--customize-hook={hook}", "bookworm", "-", "http://deb.debian.org/debian"]
    key = hashlib.sha256(shlex.join(make).encode()).hexdigest()[:12]
    tar = os.path.join(CACHE, f"test-base-{key}-{time.strftime('%G-w%V')}.tar")
    if not os.path.isfile(tar):
        for old in glob.glob(os.path.join(CACHE, "test-base-*.tar")) + glob.glob(os.path.join(CACHE, ".test-base-*")):
            os.remove(old)
        os.makedirs(CACHE, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".test-base-", dir=CACHE)
        with os.fdopen(fd, "wb") as out:
            r = subprocess.run(make, stdout=out, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=600,
                               start_new_session=True)  # see sh()
        if r.returncode != 0:
            os.remove(tmp)
            raise AssertionError(r.stderr[-3000:].decode(errors="replace"))
        os.rename(tmp, tar)  # whole, or not at all
    return tar


@pytest.fixture(scope="module")
def base(podman):
    """A base image whose python3 imports torch and torchvision: (image, mount of its torch)."""
    image = "localhost/cifar-test-base"
    assert_ran(podman("import", "-q", debian_base(), image))
    torch_dir = podman.folder / "torch"
    # uv links the files from its cache (which `make setup` filled) in about a second.
    assert_ran(sh([PY, "-m", "uv", "pip", "install", "-q", "--target", str(torch_dir), "--python-version", PYVER,
                   "--python-platform", "x86_64-manylinux_2_28", *pins()], timeout=900))
    return image, ["-v", f"{torch_dir}:{SITE}:ro"]


def cached_wheels():
    """The Horovod wheels `make setup` keeps (in CACHE) built for the pinned torch."""
    torch_pin = next(p.split("==")[1] for p in pins() if p.startswith("torch=="))
    return glob.glob(os.path.join(CACHE, f"horovod-*-torch{torch_pin}*-cp{PYVER.replace('.', '')}-cpu", "*.whl"))


@pytest.fixture(scope="module")
def image(podman, base):
    """README's `make image` on the base: (tag, the torch mount, the build's output, whether
    the wheel cache held a Horovod for the pinned torch before the build)."""
    base_image, mount = base
    tag = "localhost/cifar-test"
    line = readme_blocks(HEADING)[0][0]
    assert shlex.split(line) == ["make", "image"], line
    wheels = cached_wheels()
    os.makedirs(CACHE, exist_ok=True)
    flags = ["--network", "host", *mount, "-v", f"{CACHE}:/horovod-cache",
             "--build-arg", "HOROVOD_WHEEL_CACHE=/horovod-cache"]
    r = sh([*shlex.split(line), f"IMAGE={tag}", f"BASE={base_image}", f"CONTAINER={shlex.join(podman.argv)}",
            f"BUILD_FLAGS={shlex.join(flags)}"], cwd=ROOT, env=podman.env, timeout=1500)
    assert_ran(r)
    return tag, mount, r.stdout + r.stderr, bool(wheels)


def as_tested(line, podman, tag, mount, workspace, ssh_dir=None, hosts=None, epochs=1):
    """A README `docker run` line as this machine runs it: podman instead of docker, no GPUs,
    the base's torch mounted, one thread and 2 processes, the test's folders and hosts, tiny-run
    flags."""
    words = shlex.split(line)
    assert words[:2] == ["docker", "run"], line
    # One thread per process everywhere: one host and two then sum in the same order.
    out = [*podman.argv, "run", *mount, "-e", "OMP_NUM_THREADS=1"]
    it = iter(words[2:])
    for w in it:
        if w == "--gpus":
            next(it)
            continue
        w = (w.replace("$PWD", str(workspace)).replace("$(id -u):$(id -g)", f"{UID}:{UID}")
             .replace("~/.ssh", str(ssh_dir)).replace("cifar-horovod", tag))
        out.append(w)
        if w == "mpirun":
            out += ["-x", "OMP_NUM_THREADS"]
        elif w == "-np":
            next(it)
            out.append("2")
        elif w == "-H":
            next(it)
            out.append(",".join(f"{h}:1" for h in hosts))
        elif w == "plm_rsh_args":  # the test's own key, and no known_hosts file to ask
            out.append(next(it) + " -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null")
    if any(w.endswith("main_horovod.py") for w in out):
        out += [*TINY, "--epochs", str(epochs)]
    return out[len(podman.argv):]


def test_the_image_builds_horovod_on_the_base_torch(image):
    _, _, built, cached = image
    if cached:  # the wheel `make setup` cached serves the build: Horovod is not compiled twice
        assert "using cached wheel in /horovod-cache/" in built and "building horovod" not in built, built[-3000:]
    assert f"from {SITE}, horovod 0.28.1 with PyTorch Gloo MPI" in built, built[-3000:]


@pytest.fixture(scope="module")
def one_container(podman, image, tmp_path_factory):
    """README's first `docker run` (horovodrun -np 2) as UID 4242 in its folder: (folder, epoch 1's ckpt)."""
    tag, mount, _, _ = image
    ws = tmp_path_factory.mktemp("ws")
    os.chown(ws, UID, UID)
    line = readme_blocks(HEADING)[0][1]
    assert "--user" in line and "--resume" not in line, line
    r = assert_ran(podman(*as_tested(line, podman, tag, mount, ws)))
    assert "epoch 1/1" in r.stdout, r.stdout[-2000:]
    return ws, load_ckpt(ws / "checkpoint" / "ckpt.pth")


def test_horovodrun_in_one_container_as_any_uid_and_resume_in_another(podman, image, one_container):
    tag, mount, _, _ = image
    ws, _ = one_container
    r = podman("run", "--rm", *mount, "--user", f"{UID}:{UID}", tag, "python", "-c",
               "import os, torch, horovod; print(torch.__file__); print(horovod.__file__);"
               f"print(os.path.exists('/opt/cifar/.venv/lib/python{PYVER}/site-packages/torch'))")
    where = assert_ran(r).stdout.split()
    assert where[0].startswith(SITE) and where[1].startswith("/opt/cifar/.venv/") and where[2] == "False", where
    line = readme_blocks(HEADING)[0][2]
    assert "--resume" in line, line
    r = assert_ran(podman(*as_tested(line, podman, tag, mount, ws, epochs=2)))
    assert "resuming" in r.stdout and "epoch 2/2" in r.stdout, r.stdout[-2000:]
    rows = read_metrics(ws / "checkpoint")
    assert [(row["epoch"], row["world_size"]) for row in rows] == [("1", "2"), ("2", "2")]
    for f in ("ckpt.pth", "best.pth", "metrics.csv"):
        st = os.stat(ws / "checkpoint" / f)
        assert (st.st_uid, st.st_gid) == (UID, UID), f  # the host user's, as --user asked


@pytest.fixture
def cluster(tmp_path):
    script = os.path.join(ROOT, "scripts", "local_cluster.sh")
    cenv = env(dict(CLUSTER, CLUSTER_DIR=str(tmp_path / "cluster")))
    r = sh(["bash", script, "up", "2"], env=cenv)
    try:
        if r.returncode == 77:
            skip_or_fail(f"no cluster of network namespaces here: {r.stderr.strip()}")
        assert_ran(r)
        hosts = next(ln.split("=", 1)[1] for ln in r.stdout.splitlines() if ln.startswith("CLUSTER_HOSTS="))
        yield [h.split(":")[0] for h in hosts.split(",")]
    finally:
        down = sh(["bash", script, "down"], env=cenv, timeout=120)
        assert down.returncode == 0, down.stderr


def test_mpirun_across_containers_on_two_hosts_equals_one_container(podman, image, one_container, cluster,
                                                                     tmp_path):
    tag, mount, _, _ = image
    _, want = one_container
    ws = tmp_path / "ws"
    ssh_dir = tmp_path / "ssh"
    ws.mkdir()
    ssh_dir.mkdir(mode=0o700)
    assert_ran(sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh_dir / "id_ed25519")]))
    shutil.copy(ssh_dir / "id_ed25519.pub", ssh_dir / "authorized_keys")
    worker, launcher = readme_blocks("## Containers", "docs/INSTALL.md")[1]
    host = CLUSTER["CLUSTER_NAME"] + "-h{}"
    sshd = assert_ran(podman(*as_tested(worker, podman, tag, mount, ws, ssh_dir), netns=host.format(2)))
    cid = sshd.stdout.strip()
    try:
        r = podman(*as_tested(launcher, podman, tag, mount, ws, ssh_dir, hosts=cluster), netns=host.format(1))
        assert_ran(r)
    finally:
        podman("rm", "--force", "--time", "0", cid, timeout=120)
    assert [row["world_size"] for row in read_metrics(ws / "checkpoint")] == ["2"]
    assert_states_equal(load_ckpt(ws / "checkpoint" / "ckpt.pth")["model"], want["model"],
                        "two containers on two hosts against one container")


# ---------------------------------------------------------------------------
# The jobs of deploy/kubernetes, their pods as the operators make them (MPI Operator v0.8,
# Training Operator v1.9): each pod a container on a namespace host of its own, as the
# manifest's user, with its command, the claim's folder at /runs and what the operator adds

@pytest.fixture
def runs():
    """The claim's folder as NFS provisioners make it, where the kubelet applies no fsGroup:
    root's, writable by all; the job makes its own folders in it, as UID 1000."""
    top = pathlib.Path(tempfile.mkdtemp(prefix="k8s-runs-"))
    top.chmod(0o777)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def k8s_cluster(tmp_path, request, hosts, name, net):
    cluster = LocalCluster(tmp_path / "cluster")
    # The hosts' own sshd off the pods' port (2222): on Kubernetes a pod has its network to itself.
    cluster.env.update(CLUSTER_NAME=f"{name}{os.getpid() % 100000}", CLUSTER_NET=net, CLUSTER_SSH_PORT="2298")
    request.addfinalizer(cluster.down)
    cluster.up(hosts)
    return cluster


class Pods:
    """The containers of one job, removed at the end however it went."""

    def __init__(self, podman, image, doc, cluster, runs, names):
        self.podman, (self.tag, self.mount, _, _), self.doc = podman, image, doc
        self.cluster, self.runs, self.names, self.started = cluster, runs, names, []

    def start(self, role, name, host, env, volumes=(), extra=()):
        """`podman run -d` of the pod; its container id."""
        spec = pods(self.doc)[role]
        c, user = spec["containers"][0], spec["securityContext"]
        words = [*c["command"], *c.get("args", [])]
        if "mpirun" in words:  # the hosts share this machine's 2 cores: one thread a rank
            words[words.index("mpirun") + 1:words.index("mpirun") + 1] = ["-x", "OMP_NUM_THREADS"]
        env = dict({e["name"]: e["value"] for e in c.get("env", [])}, **env)  # the manifest's, then the operator's
        r = assert_ran(self.podman(
            "run", "-d", "--network", "host", "--hostname", name,
            *(f"--add-host={n}:{a}" for n, a in self.names), "--user", f"{user['runAsUser']}:{user['runAsGroup']}",
            *self.mount, "-v", f"{self.runs}:/runs", *volumes,
            *(f"-e={k}={v}" for k, v in dict(env, OMP_NUM_THREADS="1").items()), self.tag, *words, *extra,
            netns=f"{self.cluster.env['CLUSTER_NAME']}-h{host}"))
        self.started.append(r.stdout.strip())
        return self.started[-1]

    def wait(self, cid):
        """The container's exit status and output."""
        r = self.podman("wait", cid, timeout=600)
        return int(r.stdout.strip() or -1), self.podman("logs", cid).stdout

    def remove(self):
        for cid in self.started:
            self.podman("rm", "--force", "--time", "0", cid, timeout=120)


def test_the_mpijob_launcher_waits_for_its_workers_trains_is_killed_and_resumes(podman, image, runs, tmp_path,
                                                                               request):
    doc = job(render("horovod"))
    name, workers = doc["metadata"]["name"], doc["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
    cluster = k8s_cluster(tmp_path, request, 1 + workers, "m", "169.254.83")  # the launcher's host, then a worker's
    fqdn = [f"{name}-worker-{i}.{name}.default.svc" for i in range(workers)]
    # The operator's ConfigMap (the hostfile) and Secret (the job's key; root's files, readable
    # by all, as a Secret volume mounts them away from /root/.ssh), and its variables.
    ssh, mpi = tmp_path / "ssh", tmp_path / "mpi"
    for d in (ssh, mpi):
        d.mkdir()
        d.chmod(0o755)
    (mpi / "hostfile").write_text("".join(f"{h} slots={doc['spec']['slotsPerWorker']}\n" for h in fqdn))
    assert_ran(sh(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-N", "", "-f", str(ssh / "id_rsa")]))
    shutil.copy(ssh / "id_rsa.pub", ssh / "authorized_keys")
    for f in ssh.iterdir():
        f.chmod(0o644)
    volumes = ["-v", f"{ssh}:{doc['spec']['sshAuthMountPath']}:ro", "-v", f"{mpi}:/etc/mpi:ro"]
    env = {"OMPI_MCA_orte_keep_fqdn_hostnames": "true", "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
           "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10"}
    job_pods = Pods(podman, image, doc, cluster, runs, list(zip(fqdn, cluster.addresses[1:])))
    request.addfinalizer(job_pods.remove)
    ckpt, flags = claim_folder(doc, runs), [*TINY, "--epochs", str(UNTIL_ENDED)]
    # The launcher first: it must wait for the workers' sshd, as under an operator that does not
    # wait for them to be Ready.
    launcher = job_pods.start("Launcher", f"{name}-launcher", 1, dict(env, K_MPI_JOB_ROLE="launcher"), volumes,
                              flags)
    workers_ = [job_pods.start("Worker", f"{name}-worker-{i}", 2 + i, dict(env, K_MPI_JOB_ROLE="worker"), volumes)
                for i in range(workers)]
    # The checkpoint, and the epoch's line back through ssh and mpirun (rank 0 is on a worker):
    # killed before that line arrived, the launcher's output would not show the epoch.
    wait_until(lambda: (ckpt / "ckpt.pth").exists() and "epoch 1/" in podman("logs", launcher).stdout, 300,
               "the first epoch's checkpoint and line")
    podman("kill", launcher, timeout=60)
    code, out = job_pods.wait(launcher)
    assert code != 0 and "epoch 1/" in out, out[-3000:]
    # The ranks, on the workers, end with their launcher's connection, as its restart needs:
    # the workers keep only their sshd.
    wait_until(lambda: all("python" not in podman("top", w, "comm").stdout for w in workers_), 60,
               "the killed job's ranks to end")
    done = load_ckpt(ckpt / "ckpt.pth")["epoch"]
    # The launcher's restart: the same command (stopped one epoch on).
    again = job_pods.start("Launcher", f"{name}-launcher", 1, dict(env, K_MPI_JOB_ROLE="launcher"), volumes,
                           [*flags, "--stop-at", str(done + 1)])
    code, out = job_pods.wait(again)
    assert code == 0 and f"after epoch {done}" in out, out[-3000:]
    rows = read_metrics(ckpt)
    assert [int(r["epoch"]) for r in rows] == list(range(1, done + 2))
    assert {r["world_size"] for r in rows} == {str(workers * doc["spec"]["slotsPerWorker"])}
    assert os.stat(ckpt / "ckpt.pth").st_uid == 1000


def claim_folder(doc, runs):
    """The job's --checkpoint-dir (a folder of the claim, at /runs) in the claim's folder here."""
    words = [w for spec in pods(doc).values() for c in spec["containers"]
             for w in c.get("command", []) + c.get("args", [])]
    return runs / pathlib.PurePosixPath(words[words.index("--checkpoint-dir") + 1]).relative_to("/runs")


def operator_env(doc):
    """The variables the Training Operator v1.9 sets in every pod of the Worker-only PyTorchJob
    `doc` (pkg/controller.v1/pytorch/envvar.go and elastic.go): torchrun's PET_* rendezvous,
    at worker 0's port pytorchjob-port; torchrun gives the ranks."""
    spec, policy = doc["spec"], doc["spec"]["elasticPolicy"]
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    port = next(p["containerPort"] for p in worker["template"]["spec"]["containers"][0]["ports"]
                if p["name"] == "pytorchjob-port")
    env = {"PYTHONUNBUFFERED": "1", "PET_NPROC_PER_NODE": spec["nprocPerNode"],
           "PET_RDZV_ENDPOINT": f"{doc['metadata']['name']}-worker-0:{port}",
           "PET_RDZV_BACKEND": policy["rdzvBackend"], "PET_NNODES": str(worker["replicas"])}
    if "maxRestarts" in policy:
        env["PET_MAX_RESTARTS"] = str(policy["maxRestarts"])
    if "rdzvId" in policy:
        env["PET_RDZV_ID"] = policy["rdzvId"]
    return env


def test_the_pytorchjob_pods_train_as_one_job(podman, image, runs, tmp_path, request):
    # One run: a restart is the same command with --auto-resume, as the MPIJob's launcher above.
    doc = job(render("ddp"))
    name = doc["metadata"]["name"]
    assert {role: s["replicas"] for role, s in doc["spec"]["pytorchReplicaSpecs"].items()} == {"Worker": 2}
    cluster = k8s_cluster(tmp_path, request, 2, "p", "169.254.85")
    names = [(f"{name}-worker-{i}", cluster.addresses[i]) for i in range(2)]
    job_pods = Pods(podman, image, doc, cluster, runs, names)
    request.addfinalizer(job_pods.remove)
    # Worker 0, its pod named as the rendezvous endpoint's host, hosts torchrun's c10d store.
    cids = [job_pods.start("Worker", pod, 1 + i, operator_env(doc), extra=[*TINY, "--epochs", "1"])
            for i, (pod, _) in enumerate(names)]
    (m, out), (w, wout) = job_pods.wait(cids[0]), job_pods.wait(cids[1])
    assert (m, w) == (0, 0), out[-3000:] + wout[-3000:]
    ckpt = claim_folder(doc, runs)
    assert [(r["epoch"], r["world_size"]) for r in read_metrics(ckpt)] == [("1", "2")]
    assert os.stat(ckpt / "ckpt.pth").st_uid == 1000
