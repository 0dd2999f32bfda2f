"""The container image: the container commands of README and docs/INSTALL.md, in a tiny form, with podman.

No image registry is reachable, so the base is made here: Debian's minbase with Python
(mmdebstrap, imported into podman) and the pinned PyTorch from uv's cache. That PyTorch is
mounted read-only at the base's site folder, in the build and in every container, instead of
being copied into the base, which would add 5.9 GB and about two and a half minutes; to the
Dockerfile it is the base's PyTorch all the same. `make image` builds on that base with the
Horovod wheel `make setup` cached. Then, as those commands say: `horovodrun -np 2` in one container as
an arbitrary UID, a resume in a second container, and `mpirun` from a container on one host of
scripts/local_cluster.sh to a container running sshd on the other, which must train bitwise
what one container trained.

Everything podman makes lives under the module's own storage folder (--root), removed at the
end, also when a test fails. Needs root; installs podman, runc and mmdebstrap from Debian when
they are missing.
"""
import glob
import os
import pathlib
import shlex
import shutil
import subprocess
import tempfile

import pytest

from helpers import PY, ROOT, assert_states_equal, env, load_ckpt, read_metrics, readme_blocks, skip_or_fail

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


@pytest.fixture(scope="module")
def base(podman):
    """A base image whose python3 imports torch and torchvision: (image, mount of its torch)."""
    image = "localhost/cifar-test-base"
    # The host's certificate authorities, so that pip in the build trusts what the host's does.
    hook = 'cp /etc/ssl/certs/ca-certificates.crt "$1/etc/ssl/certs/ca-certificates.crt"'
    make = ["mmdebstrap", "--quiet", "--variant=minbase", "--include=python3,python3-venv,python3-pip,ca-certificates",
            f"--customize-hook={hook}", "bookworm", "-", "http://deb.debian.org/debian"]
    script = f"set -o pipefail; {shlex.join(make)} | {shlex.join(podman.argv)} import -q - {image}"
    assert_ran(sh(["bash", "-c", script], timeout=600, env=podman.env))
    torch_dir = podman.folder / "torch"
    # uv links the files from its cache (which `make setup` filled) in about a second.
    assert_ran(sh([PY, "-m", "uv", "pip", "install", "-q", "--target", str(torch_dir), "--python-version", PYVER,
                   "--python-platform", "x86_64-manylinux_2_28", *pins()], timeout=900))
    return image, ["-v", f"{torch_dir}:{SITE}:ro"]


def cached_wheels():
    """The folder of Horovod wheels `make setup` keeps, and those built for the pinned torch."""
    cache = os.environ.get("CIFAR_HVD_CACHE", os.path.expanduser("~/.cache/cifar-horovod"))
    torch_pin = next(p.split("==")[1] for p in pins() if p.startswith("torch=="))
    return cache, glob.glob(os.path.join(cache, f"horovod-*-torch{torch_pin}*-cp{PYVER.replace('.', '')}-cpu", "*.whl"))


@pytest.fixture(scope="module")
def image(podman, base):
    """README's `make image` on the base: (tag, the torch mount, the build's output, whether
    the wheel cache held a Horovod for the pinned torch before the build)."""
    base_image, mount = base
    tag = "localhost/cifar-test"
    line = readme_blocks(HEADING)[0][0]
    assert shlex.split(line) == ["make", "image"], line
    cache, wheels = cached_wheels()
    os.makedirs(cache, exist_ok=True)
    flags = ["--network", "host", *mount, "-v", f"{cache}:/horovod-cache",
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
