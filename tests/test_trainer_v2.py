"""deploy/kubernetes/trainer/ (main_ddp.py) and trainer-horovod/ (main_horovod.py): Kubeflow
Trainer v2 TrainJobs on the project's own TrainingRuntimes, as `kubectl kustomize` renders them,
checked against the Trainer's v2.3.0 CRDs (tests/data/crds/, SOURCES.md) with unknown fields
refused, against what the Trainer's torch and MPI plugins look for
(pkg/runtime/framework/plugins/torch and mpi), and against the rules the other jobs
meet (tests/test_kubernetes.py: the restricted profile, requests and limits, no Istio sidecar, a
TTL, images at a registry, the claim apart, a checkpoint folder of its own). No API server,
JobSet or Trainer runs here, and the pods are not run.
"""
import copy
import os
import re

from test_kubernetes import (
    DEPLOY,
    VENV_PYTHON,
    job,
    job_errors,
    launcher_errors,
    layout_errors,
    render,
    schema_errors,
    templates,
)

MPI_POD = ["bash", "/opt/cifar/deploy/kubernetes/mpi-pod.sh"]
# Variables the MPI plugin sets itself; a TrainJob's trainer.env may not name them (its webhook).
MPI_RESERVED = {"OMPI_MCA_orte_default_hostfile", "OMPI_MCA_plm_rsh_args", "OMPI_MCA_orte_keep_fqdn_hostnames",
                "OMPI_MCA_orte_set_default_slots"}


def trainjob(docs):
    return next(d for d in docs if d["kind"] == "TrainJob")


def torch_plugin_errors(runtime, train):
    """Where the torch plugin would not set torchrun's PET_* variables in the trainer's pods,
    or would set them for another number of processes than the pods' GPUs."""
    errs = []
    if runtime["spec"]["mlPolicy"].get("torch") is None:
        errs.append("no mlPolicy.torch")
    ref = train["spec"]["runtimeRef"]
    if (ref.get("apiGroup"), ref.get("kind"), ref.get("name")) != (
            "trainer.kubeflow.org", "TrainingRuntime", runtime["metadata"]["name"]):
        errs.append(f"the TrainJob's runtimeRef is not this TrainingRuntime: {ref}")
    if "trainer" not in train["spec"]:
        errs.append("no TrainJob spec.trainer (the plugin then sets nothing)")
    node = next((j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"] if j["name"] == "node"), {})
    if node.get("template", {}).get("metadata", {}).get("labels", {}).get(
            "trainer.kubeflow.org/trainjob-ancestor-step") != "trainer":
        errs.append("no replicated Job `node` labelled as the step trainer")
        return errs
    c = next((c for c in templates(runtime)["node"]["spec"]["containers"] if c["name"] == "node"), None)
    if c is None:
        return errs + ["no container named node"]
    if c["command"][:3] != [VENV_PYTHON, "-m", "torch.distributed.run"]:
        errs.append(f"torchrun is not the image's venv's: {c['command'][:3]}")
    gpus = int(c["resources"]["limits"].get("nvidia.com/gpu", 0))
    if train["spec"].get("trainer", {}).get("numProcPerNode") != gpus:
        errs.append(f"numProcPerNode is not the pod's {gpus} GPUs")
    return errs


def test_the_trainjob_and_its_runtime_pass_the_trainers_schemas_and_the_jobs_checks():
    docs = render("trainer")
    assert sorted(d["kind"] for d in docs) == ["TrainJob", "TrainingRuntime"]
    for doc in docs:
        assert schema_errors(doc) == "", doc["kind"]
    assert job_errors(job(docs)) == []
    assert torch_plugin_errors(job(docs), trainjob(docs)) == []
    assert layout_errors({f: render(f) for f in ("horovod", "ddp", "trainer", "trainer-horovod", "storage")}) == []


def test_the_overlay_sets_the_trainjobs_nodes_gpus_image_and_queue_together():
    docs = render("example-trainer")
    runtime, train = job(docs), trainjob(docs)
    for doc in docs:
        assert schema_errors(doc) == "", doc["kind"]
    assert job_errors(runtime) == [] and torch_plugin_errors(runtime, train) == []
    assert (train["spec"]["trainer"]["numNodes"], train["spec"]["trainer"]["numProcPerNode"]) == (2, 8)
    pod = templates(runtime)["node"]["spec"]
    assert pod["containers"][0]["image"] == "registry.example.com/ml-team/cifar-horovod:0.1.0"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert train["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-queue"
    # Without its own GPUs the runtime's pods would start 8 processes on 1 GPU.
    base = templates(job(render("trainer")))["node"]["spec"]["containers"][0]["resources"]
    assert torch_plugin_errors(job(render("trainer")), train) == [
        f"numProcPerNode is not the pod's {base['limits']['nvidia.com/gpu']} GPUs"]


def test_each_defect_of_the_trainjob_or_its_runtime_fails():
    docs = render("trainer")
    runtime, train = job(docs), trainjob(docs)

    def broken(doc, change):
        doc = copy.deepcopy(doc)
        change(doc)
        return doc

    def node(doc):
        return templates(doc)["node"]["spec"]["containers"][0]

    assert "numProcsPerNode" in schema_errors(broken(train, lambda d: d["spec"]["trainer"].update(numProcsPerNode=1)))
    assert "ttlSecondsAfter" in schema_errors(broken(runtime, lambda d: d["spec"]["template"]["spec"].update(
        ttlSecondsAfter=1)))
    assert torch_plugin_errors(broken(runtime, lambda d: d["spec"]["mlPolicy"].pop("torch")), train) == [
        "no mlPolicy.torch"]
    assert torch_plugin_errors(runtime, broken(train, lambda d: d["spec"].pop("trainer"))) == [
        "no TrainJob spec.trainer (the plugin then sets nothing)", "numProcPerNode is not the pod's 1 GPUs"]
    assert torch_plugin_errors(runtime, broken(train, lambda d: d["spec"]["runtimeRef"].update(
        kind="ClusterTrainingRuntime")))[0].startswith("the TrainJob's runtimeRef is not this TrainingRuntime")
    assert torch_plugin_errors(broken(runtime, lambda d: node(d).update(command=["torchrun", "main_ddp.py"])),
                               train) == ["torchrun is not the image's venv's: ['torchrun', 'main_ddp.py']"]
    assert torch_plugin_errors(broken(runtime, lambda d: d["spec"]["template"]["spec"]["replicatedJobs"][0][
        "template"]["metadata"].pop("labels")), train) == ["no replicated Job `node` labelled as the step trainer"]
    assert "node: node: allowPrivilegeEscalation must be false" in job_errors(broken(
        runtime, lambda d: node(d)["securityContext"].pop("allowPrivilegeEscalation")))
    assert "runPolicy.ttlSecondsAfterFinished" in job_errors(broken(
        runtime, lambda d: d["spec"]["template"]["spec"].pop("ttlSecondsAfterFinished")))
    shared = broken(runtime, lambda d: node(d)["command"].__setitem__(node(d)["command"].index("/runs/trainjob"),
                                                                      "/runs/ddp"))
    assert layout_errors({"ddp": render("ddp"), "trainer": [shared, train], "storage": render("storage")}) == [
        "jobs ['PyTorchJob cifar-ddp', 'TrainingRuntime cifar-torchrun'] share the checkpoint folder /runs/ddp"]


def mpi_plugin_errors(runtime, train):
    """Where the MPI plugin (v2.3.0) would not give mpi-pod.sh what it needs: the keys are mounted
    in containers named `node` only, the hostfile and OMPI_MCA_* variables in the launcher's; the
    key file is root's, mode 0640, so the pods need fsGroup; the launcher must run mpirun alone
    (runLauncherAsNode false) and the JobSet end with it."""
    errs, mpi = [], runtime["spec"]["mlPolicy"].get("mpi")
    if mpi is None:
        return ["no mlPolicy.mpi"]
    with open(os.path.join(DEPLOY, "mpi-pod.sh")) as f:
        ssh_dir = re.search(r"^SSH_DIR=\$\{SSH_DIR:-(\S+)\}$", f.read(), re.M).group(1)
    if mpi.get("sshAuthMountPath") != ssh_dir:
        errs.append(f"sshAuthMountPath is not mpi-pod.sh's SSH_DIR {ssh_dir}")
    if mpi.get("runLauncherAsNode"):
        errs.append("runLauncherAsNode: the launcher would take a node's place")
    spec = runtime["spec"]["template"]["spec"]
    jobs = {j["name"]: j for j in spec["replicatedJobs"]}
    if set(jobs) != {"node", "launcher"}:
        return errs + [f"replicated Jobs {sorted(jobs)}, not launcher and node"]
    step = {n: j["template"].get("metadata", {}).get("labels", {}).get("trainer.kubeflow.org/trainjob-ancestor-step")
            for n, j in jobs.items()}
    if step != {"launcher": "trainer", "node": None}:
        errs.append(f"the trainer step is not the launcher alone: {step}")
    if jobs["launcher"].get("dependsOn") != [{"name": "node", "status": "Ready"}]:
        errs.append("the launcher does not wait for the nodes to be Ready")
    if spec.get("successPolicy") != {"operator": "All", "targetReplicatedJobs": ["launcher"]}:
        errs.append("the JobSet does not end with its launcher (the nodes' sshd never ends)")
    pod = {}
    for name, t in templates(runtime).items():
        names = [c["name"] for c in t["spec"]["containers"]]
        if names != ["node"]:
            errs.append(f"{name}: containers {names}: the plugin mounts the keys in `node` only")
            continue
        pod[name] = t["spec"]["containers"][0]
        if (t["spec"].get("securityContext") or {}).get("fsGroup") is None:
            errs.append(f"{name}: no fsGroup: UID 1000 cannot read the plugin's key (root's, 0640)")
    if len(pod) < 2:
        return errs
    words = pod["launcher"].get("command", []) + pod["launcher"].get("args", [])
    if words[:3] != [*MPI_POD, "launcher"]:
        errs.append(f"the launcher does not run mpi-pod.sh launcher: {words[:3]}")
    if pod["launcher"].get("args"):
        errs.append("the launcher's args are the TrainJob's (its trainer.args replace them)")
    errs += launcher_errors(pod["launcher"])
    if pod["node"]["command"] != [*MPI_POD, "worker"]:
        errs.append(f"the nodes do not run mpi-pod.sh worker: {pod['node']['command']}")
    if (pod["node"].get("readinessProbe") or {}).get("tcpSocket", {}).get("port") != "ssh" or pod["node"].get(
            "ports") != [{"name": "ssh", "containerPort": 2222}]:
        errs.append("the nodes' readiness is not sshd's port 2222")
    gpus = [int(pod[n]["resources"]["limits"].get("nvidia.com/gpu", 0)) for n in ("node", "launcher")]
    slots = [train["spec"].get("trainer", {}).get("numProcPerNode"), mpi.get("numProcPerNode")]
    if gpus != [slots[0], 0] or slots[1] != slots[0]:
        errs.append(f"GPUs of a node and the launcher {gpus}; slots of the TrainJob and runtime {slots}")
    reserved = MPI_RESERVED & {e["name"] for e in train["spec"].get("trainer", {}).get("env", [])}
    if reserved:
        errs.append(f"the TrainJob sets the plugin's own variables {sorted(reserved)}")
    ref = train["spec"]["runtimeRef"]
    if (ref.get("kind"), ref.get("name")) != ("TrainingRuntime", runtime["metadata"]["name"]):
        errs.append(f"the TrainJob's runtimeRef is not this TrainingRuntime: {ref}")
    return errs


def test_the_mpi_trainjob_and_its_runtime_pass_the_trainers_schemas_and_the_jobs_checks():
    docs = render("trainer-horovod")
    assert sorted(d["kind"] for d in docs) == ["TrainJob", "TrainingRuntime"]
    for doc in docs:
        assert schema_errors(doc) == "", doc["kind"]
    assert job_errors(job(docs)) == []
    assert mpi_plugin_errors(job(docs), trainjob(docs)) == []
    assert {c["image"] for t in templates(job(docs)).values() for c in t["spec"]["containers"]} == {
        "registry.example.com/cifar-horovod:0.1.0"}
    # Its overlay: 2 nodes of 8 GPUs, 8 slots each, the image at a registry, pulled with regcred.
    docs = render("example-trainer-horovod")
    runtime, train = job(docs), trainjob(docs)
    assert [schema_errors(d) for d in docs] == ["", ""] and job_errors(runtime) == []
    assert mpi_plugin_errors(runtime, train) == []
    assert (train["spec"]["trainer"]["numNodes"], train["spec"]["trainer"]["numProcPerNode"]) == (2, 8)
    pods = templates(runtime)
    assert int(pods["node"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]) == 8
    assert {c["image"] for t in pods.values() for c in t["spec"]["containers"]} == {
        "registry.example.com/ml-team/cifar-horovod:0.1.0"}
    assert all(t["spec"]["imagePullSecrets"] == [{"name": "regcred"}] for t in pods.values())


def test_each_defect_of_the_mpi_runtime_fails():
    docs = render("trainer-horovod")
    runtime, train = job(docs), trainjob(docs)

    def errs(change):
        doc = copy.deepcopy(runtime)
        change(doc)
        return mpi_plugin_errors(doc, train)

    def pod(doc, name):
        return templates(doc)[name]["spec"]

    def mpi(doc):
        return doc["spec"]["mlPolicy"]["mpi"]

    def terrs(change):
        doc = copy.deepcopy(train)
        change(doc)
        return mpi_plugin_errors(runtime, doc)

    assert "sshMountPath" in schema_errors(
        copy.deepcopy(runtime) | {"spec": dict(runtime["spec"], mlPolicy={"mpi": {"sshMountPath": "/x"}})})
    assert errs(lambda d: mpi(d).update(sshAuthMountPath="/root/.ssh")) == [
        "sshAuthMountPath is not mpi-pod.sh's SSH_DIR /etc/cifar-ssh"]
    assert errs(lambda d: mpi(d).update(runLauncherAsNode=True)) == [
        "runLauncherAsNode: the launcher would take a node's place"]
    assert errs(lambda d: pod(d, "launcher")["containers"][0].update(name="launcher")) == [
        "launcher: containers ['launcher']: the plugin mounts the keys in `node` only"]
    assert errs(lambda d: pod(d, "node")["securityContext"].pop("fsGroup")) == [
        "node: no fsGroup: UID 1000 cannot read the plugin's key (root's, 0640)"]
    assert errs(lambda d: d["spec"]["template"]["spec"].pop("successPolicy")) == [
        "the JobSet does not end with its launcher (the nodes' sshd never ends)"]
    assert errs(lambda d: d["spec"]["template"]["spec"]["replicatedJobs"][1].pop("dependsOn")) == [
        "the launcher does not wait for the nodes to be Ready"]
    assert errs(lambda d: d["spec"]["template"]["spec"]["replicatedJobs"][1]["template"].pop("metadata")) == [
        "the trainer step is not the launcher alone: {'node': None, 'launcher': None}"]
    launcher = pod(runtime, "launcher")["containers"][0]["command"]
    assert any("--hostfile" in e for e in errs(lambda d: pod(d, "launcher")["containers"][0].update(
        command=[w for w in launcher if w not in ("--hostfile", "/etc/mpi/hostfile")])))
    assert errs(lambda d: pod(d, "launcher")["containers"][0].update(command=launcher[:3], args=launcher[3:])) == [
        "the launcher's args are the TrainJob's (its trainer.args replace them)"]
    assert errs(lambda d: pod(d, "node")["containers"][0].pop("readinessProbe")) == [
        "the nodes' readiness is not sshd's port 2222"]
    assert errs(lambda d: mpi(d).update(numProcPerNode=2)) == [
        "GPUs of a node and the launcher [1, 0]; slots of the TrainJob and runtime [1, 2]"]
    assert terrs(lambda d: d["spec"]["trainer"].update(env=[{"name": "OMPI_MCA_plm_rsh_args", "value": ""}])) == [
        "the TrainJob sets the plugin's own variables ['OMPI_MCA_plm_rsh_args']"]
    assert terrs(lambda d: d["spec"]["runtimeRef"].update(name="cifar-torchrun"))[0].startswith(
        "the TrainJob's runtimeRef is not this TrainingRuntime")
    assert mpi_plugin_errors(job(render("trainer")), train) == ["no mlPolicy.mpi"]
