"""The DDP TrainJob's pods (deploy/kubernetes/trainer) run as processes on this machine, each on a
network namespace host of its own with its pod's hostname, as UID 1000 (runAsUser, runAsGroup,
fsGroup), no capabilities and no new privileges, as tests/test_k8s_mpi_pods.py runs the MPI
jobs' pods: the runtime's own command (torchrun of /opt/cifar/main_ddp.py, the image's paths,
/opt/cifar being the repository) with the TrainJob's args, and the variables the Trainer's torch
plugin (v2.3.0) sets in the container `node`:

- PET_NNODES and PET_NPROC_PER_NODE from the TrainJob, PET_NODE_RANK the pod's completion index,
  PET_MASTER_ADDR `<trainjob>-node-0-0.<trainjob>` and PET_MASTER_PORT 29400;
- the pods' names published as JobSet's headless Service publishes them (not-ready addresses
  included: a pod is named once it runs), in each pod's /etc/hosts.

The claim's folder is made as an NFS provisioner makes it (root's, writable by all, not chowned
to 1000), and stands in for /runs: the runtime's paths under /runs are the folder's here. The
job trains a real LeNet epoch on generated data (the TrainJob's args) into its checkpoint
folder there.
"""
import os
import shutil
import time

from helpers import LocalCluster, skip_or_fail
from test_k8s_mpi_pods import Pods
from test_k8s_mpi_pods import top as top  # the fixture
from test_kubernetes import render, templates
from test_trainer_v2 import trainjob

ARGS = ["--arch", "lenet", "--dataset", "synthetic", "--synthetic-size", "500", "--batch-size", "64"]


def as_trainer(docs):
    """(the node pods' spec, their names, each pod's PET_* variables) as the Trainer makes them."""
    runtime = next(d for d in docs if d["kind"] == "TrainingRuntime")
    train = trainjob(docs)
    assert runtime["spec"]["mlPolicy"]["torch"] is not None
    name, spec = train["metadata"]["name"], train["spec"]["trainer"]
    nodes, per_node = spec["numNodes"], spec["numProcPerNode"]
    names = [f"{name}-node-0-{i}" for i in range(nodes)]
    env = [{"PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": str(per_node), "PET_NODE_RANK": str(i),
            "PET_MASTER_ADDR": f"{names[0]}.{name}", "PET_MASTER_PORT": "29400"} for i in range(nodes)]
    return templates(runtime)["node"]["spec"], names, [f"{n}.{name}" for n in names], env


def run_job(cluster, top, spec, names, fqdns, envs, words):
    """The node pods, each published once it runs; (each pod's exit code, its log)."""
    pods = Pods(cluster, top / "pods", top / "none", str(top / "none-mount"))
    try:
        started = []
        for i, (name, env) in enumerate(zip(names, envs)):
            started.append(pods.start(1 + i, name, spec, words, env))
            pods.publish(f"{fqdns[i]} {name}", cluster.addresses[i])
        codes, deadline = [], time.monotonic() + 180
        for proc, _ in started:
            try:
                codes.append(proc.wait(timeout=max(1, deadline - time.monotonic())))
            except Exception:
                codes.append(None)
        return codes, [log.read_text() for _, log in started]
    finally:
        pods.end()


def test_the_ddp_trainjob_trains_across_its_nodes_into_the_claim(top, request):  # noqa: F811
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        skip_or_fail("the pods need root (namespaces, mounts) and setpriv")
    spec, names, fqdns, envs = as_trainer(render("trainer"))
    c = spec["containers"][0]
    assert c["name"] == "node" and spec["securityContext"]["runAsUser"] == 1000
    runs = top / "runs"  # the claim's folder: root's, writable by all
    runs.mkdir(mode=0o777)
    runs.chmod(0o777)
    (top / "none").mkdir()
    words = [str(runs / os.path.relpath(w, "/runs")) if w.startswith("/runs/") else w
             for w in [*c["command"], *c.get("args", [])]]
    ckpt = runs / "trainjob"
    assert str(ckpt) in words and "--auto-resume" in words
    cluster = LocalCluster(top / "cluster")
    cluster.env.update(CLUSTER_NAME=f"kt{os.getpid() % 100000}", CLUSTER_NET="169.254.91")
    request.addfinalizer(cluster.down)
    cluster.up(len(names))

    codes, logs = run_job(cluster, top, spec, names, fqdns, envs, words + ARGS + ["--epochs", "1"])
    assert codes == [0] * len(names), [log[-3000:] for log in logs]
    assert f"world {len(names)}" in logs[0], logs[0][-3000:]
    assert os.stat(ckpt).st_uid == 1000 and os.stat(runs).st_uid == 0
    assert (ckpt / "ckpt.pth").is_file()
    rows = [r.split(",") for r in (ckpt / "metrics.csv").read_text().splitlines()]
    assert [(r[0], r[rows[0].index("world_size")]) for r in rows[1:]] == [("1", "2")], rows
    # A pod made again runs the same command: --auto-resume then continues from this folder, as
    # the PyTorchJob's and the MPIJob's restarts do in tests/test_container.py.
