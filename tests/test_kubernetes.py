"""deploy/kubernetes/: the MPIJob (Horovod) and PyTorchJob (DDP) manifests as `kubectl kustomize`
renders them, checked against the operators' own CRD schemas (tests/data/crds/, SOURCES.md) and
Kubernetes' built-in ones, and the commands the docs give.

No API server runs here: nothing is applied to a cluster. The schemas are checked as the API
server's strict field validation would (an unknown field is an error), with python-jsonschema
and kubernetes-validate; the operators' own validation, which the schemas do not hold (a
launcher and a master of one replica, the restart policies, the container the Training Operator
looks for), is checked beside it from their published rules, and so are the restricted Pod
Security Standard on the pods as the operators make them and what a real cluster needs of the
jobs (requests, the claim apart, images at a registry, mpirun for Open MPI 4 and 5); each check
is shown to fail on its defect. The jobs' pods run in the project's image in
tests/test_container.py. Without kubectl (which renders the overlays) the module is skipped, in
one line; under CI it fails instead.
"""
import copy
import functools
import gzip
import os
import shlex
import shutil
import subprocess

import pytest
import yaml

from helpers import ROOT, readme_blocks, skip_or_fail

try:  # make setup installs them; a TORCH=system set-up leaves them out
    import jsonschema
    import kubernetes_validate
except ImportError:
    jsonschema = kubernetes_validate = None

DEPLOY = os.path.join(ROOT, "deploy", "kubernetes")
CRDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "crds")
FOLDERS = ("horovod", "ddp", "example", "example-ddp")
K8S_VERSION = "1.32.0"  # kubectl's here; kubernetes-validate holds the schemas of 1.25 to 1.37
VENV_PYTHON = "/opt/cifar/.venv/bin/python"  # the Dockerfile's venv, first on its PATH
CRD_FILES = {"MPIJob": "kubeflow.org_mpijobs", "PyTorchJob": "kubeflow.org_pytorchjobs",
             "TrainJob": "trainer.kubeflow.org_trainjobs", "TrainingRuntime": "trainer.kubeflow.org_trainingruntimes"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}  # the restricted profile's volume types


def render(folder):
    """The documents `kubectl apply -k deploy/kubernetes/<folder>` would send."""
    if not shutil.which("kubectl"):
        skip_or_fail("kubectl is not installed: it renders the kustomize overlays of deploy/kubernetes")
    r = subprocess.run(["kubectl", "kustomize", os.path.join(DEPLOY, folder)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return list(yaml.safe_load_all(r.stdout))


def strict(schema):
    """The schema with unknown fields refused wherever it lists an object's fields, as the API
    server's strict field validation (kubectl's default) refuses them."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


@functools.lru_cache(maxsize=None)
def crd_validator(kind, version):
    """A validator of the served `version` of the operator's CRD for `kind`."""
    with gzip.open(os.path.join(CRDS, f"{CRD_FILES[kind]}.yaml.gz"), "rt") as f:
        # libyaml's parser, where PyYAML has it, reads the 670 KB several times faster.
        crd = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    served = {v["name"]: v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["served"]}
    schema = served[version]
    return jsonschema.Draft7Validator(strict(schema))


def schema_errors(doc):
    """What the validators say of one document: python-jsonschema against the operator's CRD
    for a job, kubernetes-validate (strict) against Kubernetes' own schema for a built-in kind.
    Empty when it passes."""
    if kubernetes_validate is None:
        skip_or_fail("kubernetes-validate is not installed (make setup installs it, and python-jsonschema with it)")
    if doc["kind"] in CRD_FILES:
        errors = crd_validator(doc["kind"], doc["apiVersion"].split("/")[1]).iter_errors(doc)
        return "; ".join(sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors))
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return str(e)
    return ""


def operator_errors(doc):
    """The operators' own checks of a job, beyond the CRD schema (mpi-operator's
    pkg/apis/kubeflow/validation, the Training Operator's PyTorchJob webhook)."""
    errs = []
    if doc["kind"] == "MPIJob":
        specs = doc["spec"].get("mpiReplicaSpecs") or {}
        if doc["spec"].get("runPolicy", {}).get("cleanPodPolicy") not in ("None", "Running", "All"):
            errs.append("runPolicy.cleanPodPolicy must be None, Running or All")
        if "Launcher" not in specs:
            errs.append("no Launcher replica spec")
    else:
        specs = doc["spec"].get("pytorchReplicaSpecs") or {}
        if doc["spec"].get("elasticPolicy") is not None and "Worker" not in specs:
            errs.append("Worker must be configured if elastic policy is used")
        for role, spec in specs.items():
            containers = spec["template"]["spec"]["containers"]
            if not any(c.get("name") == "pytorch" for c in containers):
                errs.append(f"{role} needs a container named pytorch")
            if not all(c.get("image") for c in containers):
                errs.append(f"{role} has a container without an image")
    one = "Launcher" if doc["kind"] == "MPIJob" else "Master"
    for role, spec in specs.items():
        if spec.get("replicas") is None or spec["replicas"] < 1 or (role == one and spec["replicas"] != 1):
            errs.append(f"{role}.replicas {spec.get('replicas')}")
        if doc["kind"] == "MPIJob" and spec.get("restartPolicy") not in ("Never", "OnFailure"):
            errs.append(f"{role}.restartPolicy must be Never or OnFailure")
    return errs


def job(docs):
    return next(d for d in docs if d["kind"] in ("MPIJob", "PyTorchJob", "TrainingRuntime"))


def templates(doc):
    """The pod templates of a job by role (of a TrainingRuntime: by replicated Job)."""
    if doc["kind"] == "TrainingRuntime":
        return {j["name"]: j["template"]["spec"]["template"] for j in doc["spec"]["template"]["spec"]["replicatedJobs"]}
    specs = doc["spec"].get("mpiReplicaSpecs") or doc["spec"]["pytorchReplicaSpecs"]
    return {role: spec["template"] for role, spec in specs.items()}


def pods(doc):
    return {role: t["spec"] for role, t in templates(doc).items()}


def created_templates(doc):
    """The pod templates as the operator creates the pods: the Training Operator v1.9 adds to
    every Worker of a PyTorchJob with a Master its init container `init-pytorch` (alpine's
    nslookup of the master, no securityContext: pkg/controller.v1/pytorch/initcontainer.go);
    the MPI Operator v0.8 adds none."""
    out = copy.deepcopy(templates(doc))
    if doc["kind"] == "PyTorchJob" and "Master" in out and "Worker" in out:
        out["Worker"]["spec"].setdefault("initContainers", []).append({
            "name": "init-pytorch", "image": "alpine:3.10", "command": ["sh", "-c", "nslookup ..."],
            "resources": {"limits": {"cpu": "100m", "memory": "20Mi"}, "requests": {"cpu": "50m", "memory": "10Mi"}}})
    return out


def restricted_errors(spec):
    """What the restricted Pod Security Standard (Kubernetes' pod-security admission, the
    baseline and restricted checks) refuses in a pod spec; empty when it admits it."""
    errs, pod = [], spec.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            errs.append(key)
    errs += [f"volume {v['name']}: {sorted(set(v) - {'name'})}" for v in spec.get("volumes", [])
             if not set(v) - {"name"} <= RESTRICTED_VOLUMES]
    for c in spec.get("initContainers", []) + spec["containers"]:
        sc = c.get("securityContext") or {}
        caps, own = sc.get("capabilities") or {}, {**pod, **sc}  # the container's settings over the pod's
        bad = {"privileged": sc.get("privileged"),
               "allowPrivilegeEscalation must be false": sc.get("allowPrivilegeEscalation") is not False,
               "capabilities must drop ALL": "ALL" not in caps.get("drop", []),
               "capabilities may add NET_BIND_SERVICE alone": set(caps.get("add", [])) - {"NET_BIND_SERVICE"},
               "runAsNonRoot must be true": own.get("runAsNonRoot") is not True,
               "runAsUser 0": own.get("runAsUser") == 0,
               "seccompProfile must be RuntimeDefault or Localhost":
                   (own.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"),
               "hostPort": any(p.get("hostPort") for p in c.get("ports", []))}
        errs += [f"{c['name']}: {m}" for m, b in bad.items() if b]
    return errs


def job_errors(doc):
    """What this project asks of a job beyond what admits it: the pods as the operator makes them
    under the restricted profile, requests and a memory limit on every container, a size on
    every memory-backed emptyDir, no Istio sidecar, a TTL, images at a registry and a fixed tag,
    the launcher's mpirun for Open MPI 4 and 5, torchrun from the image's venv."""
    errs = []
    if not (doc["spec"].get("runPolicy") or doc["spec"].get("template", {}).get("spec", {})).get(
            "ttlSecondsAfterFinished"):  # the job's runPolicy's, or a TrainingRuntime's JobSet's
        errs.append("runPolicy.ttlSecondsAfterFinished")
    for role, template in created_templates(doc).items():
        spec = template["spec"]
        errs += [f"{role}: {e}" for e in restricted_errors(spec)]
        if (template.get("metadata") or {}).get("annotations", {}).get("sidecar.istio.io/inject") != "false":
            errs.append(f"{role}: no sidecar.istio.io/inject: \"false\"")
        for v in spec.get("volumes", []):
            if (v.get("emptyDir") or {}).get("medium") == "Memory" and "sizeLimit" not in v["emptyDir"]:
                errs.append(f"{role}: emptyDir {v['name']} without sizeLimit")
        for c in spec.get("initContainers", []) + spec["containers"]:
            res = c.get("resources") or {}
            if not {"cpu", "memory"} <= set(res.get("requests", {})) or "memory" not in res.get("limits", {}):
                errs.append(f"{role}: {c['name']} needs cpu and memory requests and a memory limit")
            image = c.get("image", "")
            host, _, rest = image.partition("/")
            tag = rest.rpartition(":")[2] if ":" in rest else ""
            if not rest or not ("." in host or ":" in host or host == "localhost") or (
                    "@" not in rest and tag in ("", "latest")):
                errs.append(f"{role}: image {image!r} is not a registry's, at a fixed tag")
    if doc["kind"] == "MPIJob":
        errs += launcher_errors(templates(doc)["Launcher"]["spec"]["containers"][0])
    elif doc["kind"] == "PyTorchJob":
        if "Master" in templates(doc):
            errs.append("a Master replica: its Workers get the operator's init container")
        if (doc["spec"].get("elasticPolicy") or {}).get("rdzvBackend") != "c10d":
            errs.append("no elasticPolicy with rdzvBackend c10d: without a Master, the rendezvous")
        for role, template in templates(doc).items():
            c = next(c for c in template["spec"]["containers"] if c["name"] == "pytorch")
            if c["command"][:3] != [VENV_PYTHON, "-m", "torch.distributed.run"]:
                errs.append(f"{role}: torchrun is not the image's venv's: {c['command'][:3]}")
            if not any(p.get("name") == "pytorchjob-port" for p in c.get("ports", [])):
                errs.append(f"{role}: no port pytorchjob-port (the rendezvous endpoint's)")
    return errs


def launcher_errors(container):
    """The launcher's mpirun, as Open MPI 4 and 5 both run it."""
    words = container.get("command", []) + container.get("args", [])
    errs, mpirun = [], words[words.index("mpirun") + 1:] if "mpirun" in words else []
    pairs = list(zip(mpirun, mpirun[1:]))
    if ("--hostfile", "/etc/mpi/hostfile") not in pairs:
        errs.append("mpirun without --hostfile /etc/mpi/hostfile (Open MPI 5 ignores OMPI_MCA_orte_default_hostfile)")
    for want in (("pml", "ob1"), ("btl", "^openib")):
        if want not in pairs:
            errs.append(f"mpirun without --mca {' '.join(want)}")
    forwarded = {b.split("=")[0] for a, b in pairs if a == "-x"}
    if words[:3] == ["bash", "/opt/cifar/deploy/kubernetes/mpi-pod.sh", "launcher"]:
        forwarded |= {e["name"] for e in container.get("env", [])}  # it forwards every NCCL_* it has
    nccl = {e["name"] for e in container.get("env", []) if e["name"].startswith("NCCL_")}
    if not nccl or nccl - forwarded:
        errs.append(f"NCCL settings not forwarded with -x: {sorted(nccl - forwarded) or 'none set'}")
    if VENV_PYTHON not in mpirun:
        errs.append("the ranks' python is not the image's venv's")
    return errs


def layout_errors(rendered):
    """Across the folders: the claim in storage/ alone (deleting a job keeps the data), every job
    mounting it, and each job's checkpoints in a folder of its own."""
    errs = []
    claims = [d["metadata"]["name"] for d in rendered["storage"] if d["kind"] == "PersistentVolumeClaim"]
    if len(claims) != 1 or not rendered["storage"][0]["spec"].get("storageClassName"):
        errs.append("storage/ must hold one claim, with its storage class")
    folders = {}
    for folder, docs in rendered.items():
        if folder == "storage":
            continue
        if any(d["kind"] == "PersistentVolumeClaim" for d in docs):
            errs.append(f"{folder}/ holds a claim: kubectl delete -k {folder}/ would delete the data")
        doc = job(docs)
        for role, template in templates(doc).items():
            if not any((v.get("persistentVolumeClaim") or {}).get("claimName") in claims
                       for v in template["spec"]["volumes"]):
                errs.append(f"{folder}: {role} does not mount the claim of storage/")
        words = [w for t in templates(doc).values() for c in t["spec"]["containers"]
                 for w in c.get("command", []) + c.get("args", [])]
        if "--auto-resume" not in words or "--checkpoint-dir" not in words:
            errs.append(f"{folder}: no --auto-resume --checkpoint-dir")
            continue
        # An overlay of a job (example/) is that job again: its kind and name say which job it is.
        name = f"{doc['kind']} {doc['metadata']['name']}"
        folders.setdefault(words[words.index("--checkpoint-dir") + 1], set()).add(name)
    errs += [f"jobs {sorted(j)} share the checkpoint folder {d}" for d, j in folders.items() if len(j) > 1]
    errs += [f"checkpoint folder {d} not on the claim's own folder of the job" for d in folders
             if not d.startswith("/runs/") or d in ("/runs/data", "/runs/checkpoint")]
    return errs


def rendered_all():
    return {f: render(f) for f in FOLDERS + ("storage",)}


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_job_passes_its_operators_schema_and_checks_and_the_restricted_profile(folder):
    docs = render(folder)
    assert [d["kind"] for d in docs] == ["PyTorchJob" if folder.endswith("ddp") else "MPIJob"]
    assert schema_errors(docs[0]) == ""
    assert operator_errors(docs[0]) == []
    assert job_errors(docs[0]) == []


def test_the_claim_lives_in_storage_alone_and_each_job_has_its_own_checkpoints():
    rendered = rendered_all()
    assert [d["kind"] for d in rendered["storage"]] == ["PersistentVolumeClaim"]
    assert schema_errors(rendered["storage"][0]) == ""
    assert layout_errors(rendered) == []
    assert {w for f in ("horovod", "ddp") for t in templates(job(rendered[f])).values()
            for c in t["spec"]["containers"] for w in c.get("command", []) + c.get("args", [])
            if w.startswith("/runs/")} == {"/runs/data", "/runs/horovod", "/runs/ddp"}


def test_each_defect_of_the_manifests_fails():
    rendered = rendered_all()
    mpi, ddp = job(rendered["horovod"]), job(rendered["ddp"])

    def broken(doc, change):
        doc = copy.deepcopy(doc)
        change(doc)
        return job_errors(doc)

    def spec(doc, role):
        return templates(doc)[role]["spec"]

    # The restricted profile, container by container and where the pod sets it.
    for key in ("allowPrivilegeEscalation", "capabilities", "runAsNonRoot", "seccompProfile"):
        errs = broken(mpi, lambda d, key=key: [spec(d, r)["containers"][0]["securityContext"].pop(key)
                                               for r in ("Launcher", "Worker")]
                      and [spec(d, r)["securityContext"].pop(key, None) for r in ("Launcher", "Worker")])
        assert any(key in e for e in errs), (key, errs)
    assert any("privileged" in e for e in broken(
        ddp, lambda d: spec(d, "Worker")["containers"][0]["securityContext"].update(privileged=True)))
    # A Master: the operator's init container, as root with no securityContext, on the Workers.
    with_master = copy.deepcopy(ddp)
    with_master["spec"]["pytorchReplicaSpecs"]["Master"] = copy.deepcopy(
        with_master["spec"]["pytorchReplicaSpecs"]["Worker"]) | {"replicas": 1}
    errs = job_errors(with_master)
    assert operator_errors(with_master) == [] and schema_errors(with_master) == ""
    assert "a Master replica: its Workers get the operator's init container" in errs
    assert "Worker: init-pytorch: allowPrivilegeEscalation must be false" in errs
    assert "Worker: image 'alpine:3.10' is not a registry's, at a fixed tag" in errs
    # Requests, limits, the shared memory's size, Istio, the TTL.
    assert "Worker: worker needs cpu and memory requests and a memory limit" in broken(
        mpi, lambda d: spec(d, "Worker")["containers"][0]["resources"]["requests"].pop("cpu"))
    assert "Worker: pytorch needs cpu and memory requests and a memory limit" in broken(
        ddp, lambda d: spec(d, "Worker")["containers"][0]["resources"]["limits"].pop("memory"))
    assert "Worker: emptyDir shm without sizeLimit" in broken(
        mpi, lambda d: spec(d, "Worker")["volumes"][1]["emptyDir"].pop("sizeLimit"))
    assert "Launcher: no sidecar.istio.io/inject: \"false\"" in broken(
        mpi, lambda d: templates(d)["Launcher"].pop("metadata"))
    assert "runPolicy.ttlSecondsAfterFinished" in broken(ddp, lambda d: d["spec"]["runPolicy"].pop(
        "ttlSecondsAfterFinished"))
    # Images: Docker Hub's library namespace, or no fixed tag.
    for image in ("cifar-horovod", "cifar-horovod:0.1.0", "registry.example.com/cifar-horovod",
                  "registry.example.com/cifar-horovod:latest"):
        assert f"Worker: image {image!r} is not a registry's, at a fixed tag" in broken(
            mpi, lambda d, image=image: spec(d, "Worker")["containers"][0].update(image=image)), image
    assert job_errors(job(render("example"))) == []  # its own registry's image passes
    # The launcher's mpirun.
    launcher = spec(mpi, "Launcher")["containers"][0]
    args = launcher["args"]
    for drop, message in ((["--hostfile", "/etc/mpi/hostfile"], "--hostfile"), (["--mca", "pml", "ob1"], "pml ob1"),
                          (["-x", "NCCL_DEBUG"], "NCCL_DEBUG")):
        at = next(i for i in range(len(args)) if args[i:i + len(drop)] == drop)
        # NCCL_DEBUG goes with the ranks by -x or by mpi-pod.sh's launcher: without either, it does not.
        errs = launcher_errors(dict(launcher, args=args[:at] + args[at + len(drop):],
                                    command=[] if "NCCL" in message else launcher["command"]))
        assert any(message in e for e in errs), (drop, errs)
    assert launcher_errors(dict(launcher, command=[])) == []
    assert launcher_errors(dict(launcher, env=[])) == ["NCCL settings not forwarded with -x: none set"]
    # torchrun from outside the image's venv, the rendezvous without its port.
    assert "Worker: torchrun is not the image's venv's: ['torchrun', '/opt/cifar/main_ddp.py', '--download']" in broken(
        ddp, lambda d: spec(d, "Worker")["containers"][0].update(command=["torchrun", *spec(d, "Worker")[
            "containers"][0]["command"][3:]]))
    assert "Worker: no port pytorchjob-port (the rendezvous endpoint's)" in broken(
        ddp, lambda d: spec(d, "Worker")["containers"][0].pop("ports"))
    # The claim in a job's folder, two jobs on one checkpoint folder.
    with_claim = dict(rendered, horovod=rendered["horovod"] + rendered["storage"])
    assert layout_errors(with_claim) == ["horovod/ holds a claim: kubectl delete -k horovod/ would delete the data"]
    shared = copy.deepcopy(rendered)
    command = spec(job(shared["ddp"]), "Worker")["containers"][0]["command"]
    command[command.index("/runs/ddp")] = "/runs/horovod"
    assert layout_errors(shared) == [
        "jobs ['MPIJob cifar-horovod', 'PyTorchJob cifar-ddp'] share the checkpoint folder /runs/horovod"]


def test_a_broken_manifest_fails_its_schema_or_operator():
    mpi, ddp, pvc = job(render("horovod")), job(render("ddp")), render("storage")[0]
    wrong_field = copy.deepcopy(mpi)
    wrong_field["spec"]["slotsPerNode"] = wrong_field["spec"].pop("slotsPerWorker")
    assert "slotsPerNode" in schema_errors(wrong_field)
    wrong_type = copy.deepcopy(ddp)
    wrong_type["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "two"
    assert schema_errors(wrong_type)
    misspelled = copy.deepcopy(pvc)
    misspelled["spec"]["accesModes"] = misspelled["spec"].pop("accessModes")
    assert schema_errors(misspelled)
    no_launcher = copy.deepcopy(mpi)
    del no_launcher["spec"]["mpiReplicaSpecs"]["Launcher"]
    assert schema_errors(no_launcher) == "" and operator_errors(no_launcher) == ["no Launcher replica spec"]
    renamed = copy.deepcopy(ddp)
    renamed["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = "trainer"
    assert operator_errors(renamed) == ["Worker needs a container named pytorch"]


def test_the_overlay_sets_gpus_slots_image_and_queue_together():
    base, example = job(render("horovod")), job(render("example"))
    assert base["spec"]["slotsPerWorker"] == 1 and example["spec"]["slotsPerWorker"] == 8
    for doc, gpus in ((base, 1), (example, 8)):
        worker = templates(doc)["Worker"]["spec"]["containers"][0]
        assert int(worker["resources"]["limits"]["nvidia.com/gpu"]) == gpus
        assert "nvidia.com/gpu" not in templates(doc)["Launcher"]["spec"]["containers"][0]["resources"]["limits"]
    assert example["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-queue"
    assert "kueue.x-k8s.io/queue-name" not in base["metadata"].get("labels", {})
    for doc, image in ((base, "registry.example.com/cifar-horovod:0.1.0"),
                       (example, "registry.example.com/ml-team/cifar-horovod:0.1.0")):
        assert {c["image"] for t in templates(doc).values() for c in t["spec"]["containers"]} == {image}
    assert all(t["spec"]["imagePullSecrets"] == [{"name": "regcred"}] for t in templates(example).values())
    # The launcher starts when the workers' sshd answers their readiness probe, on the port
    # mpi-pod.sh runs it on; it mounts the ssh keys where mpi-pod.sh looks for them.
    assert base["spec"]["launcherCreationPolicy"] == "WaitForWorkersReady"
    worker = templates(base)["Worker"]["spec"]["containers"][0]
    assert worker["readinessProbe"]["tcpSocket"]["port"] == "ssh" and worker["ports"] == [
        {"name": "ssh", "containerPort": 2222}]
    with open(os.path.join(DEPLOY, "mpi-pod.sh")) as f:
        script = f.read()
    assert "SSH_PORT=${SSH_PORT:-2222}" in script
    assert f"SSH_DIR=${{SSH_DIR:-{base['spec']['sshAuthMountPath']}}}" in script
    for folder, nproc in (("ddp", 1), ("example-ddp", 8)):
        ddp = job(render(folder))
        pod = templates(ddp)["Worker"]["spec"]
        gpus = int(pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        assert gpus == int(ddp["spec"]["nprocPerNode"]) == nproc, folder
        overlay = folder == "example-ddp"
        registry = "registry.example.com/ml-team" if overlay else "registry.example.com"
        assert pod["containers"][0]["image"] == f"{registry}/cifar-horovod:0.1.0", folder
        assert pod.get("imagePullSecrets") == ([{"name": "regcred"}] if overlay else None), folder
        assert ("kueue.x-k8s.io/queue-name" in ddp["metadata"].get("labels", {})) == overlay, folder


def test_the_documented_commands_apply_the_storage_first_then_the_folders_tested_here():
    for doc, heading in (("README.md", "## Run on Kubernetes"), ("docs/MULTI_NODE.md", "## Kubernetes"),
                         ("docs/KUBERNETES.md", "# Kubernetes")):
        lines = readme_blocks(heading, doc)[0]
        words = [shlex.split(ln, comments=True) for ln in lines]
        assert all(w[:3] == ["kubectl", "apply", "-k"] and len(w) == 4 for w in words), lines
        # The claim before any job mounts it; then jobs only, each of them tested above.
        assert words[0][3] == "deploy/kubernetes/storage", lines
        tested = FOLDERS + ("trainer", "trainer-horovod", "example-trainer", "example-trainer-horovod")
        assert {w[3] for w in words[1:]} <= {f"deploy/kubernetes/{f}" for f in tested}, lines
