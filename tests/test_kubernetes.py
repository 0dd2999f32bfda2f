"""deploy/kubernetes/: the MPIJob (Horovod) and PyTorchJob (DDP) manifests as `kubectl kustomize`
renders them, checked against the operators' own CRD schemas (tests/data/crds/, SOURCES.md) and
Kubernetes' built-in ones, and the commands the docs give.

No API server runs here: nothing is applied to a cluster. The schemas are checked as the API
server's strict field validation would (an unknown field is an error), with python-jsonschema
and kubernetes-validate; the operators' own validation, which the schemas do not hold (a
launcher and a master of one replica, the restart policies, the container the Training Operator
looks for), is checked beside it from their published rules. The jobs' pods run in the
project's image in tests/test_container.py. Without kubectl (which renders the overlays) the
module is skipped, in one line; under CI it fails instead.
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
FOLDERS = ("horovod", "ddp", "example")
K8S_VERSION = "1.32.0"  # kubectl's here; kubernetes-validate holds the schemas of 1.25 to 1.37


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
    name = {"MPIJob": "kubeflow.org_mpijobs", "PyTorchJob": "kubeflow.org_pytorchjobs"}[kind]
    with gzip.open(os.path.join(CRDS, f"{name}.yaml.gz"), "rt") as f:
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
    if doc["kind"] in ("MPIJob", "PyTorchJob"):
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
        specs, one = doc["spec"].get("mpiReplicaSpecs") or {}, "Launcher"
        if doc["spec"].get("runPolicy", {}).get("cleanPodPolicy") not in ("None", "Running", "All"):
            errs.append("runPolicy.cleanPodPolicy must be None, Running or All")
    else:
        specs, one = doc["spec"].get("pytorchReplicaSpecs") or {}, "Master"
        for role, spec in specs.items():
            if not any(c.get("name") == "pytorch" for c in spec["template"]["spec"]["containers"]):
                errs.append(f"{role} needs a container named pytorch")
    if one not in specs:
        errs.append(f"no {one} replica spec")
    for role, spec in specs.items():
        if spec.get("replicas") is None or spec["replicas"] < 1 or (role == one and spec["replicas"] != 1):
            errs.append(f"{role}.replicas {spec.get('replicas')}")
        if doc["kind"] == "MPIJob" and spec.get("restartPolicy") not in ("Never", "OnFailure"):
            errs.append(f"{role}.restartPolicy must be Never or OnFailure")
    return errs


def job(docs):
    return next(d for d in docs if d["kind"] in ("MPIJob", "PyTorchJob"))


def pods(doc):
    specs = doc["spec"].get("mpiReplicaSpecs") or doc["spec"]["pytorchReplicaSpecs"]
    return {role: spec["template"]["spec"] for role, spec in specs.items()}


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_manifest_passes_its_operators_schema_and_checks(folder):
    docs = render(folder)
    assert sorted(d["kind"] for d in docs) == sorted(["PersistentVolumeClaim",
                                                      "PyTorchJob" if folder == "ddp" else "MPIJob"])
    for doc in docs:
        assert schema_errors(doc) == "", doc["kind"]
    assert operator_errors(job(docs)) == []
    # Every pod runs as the image's user 1000, not root, and mounts the claim the job's restarts
    # resume from, which --auto-resume reads.
    claim = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")["metadata"]["name"]
    for role, spec in pods(job(docs)).items():
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 1000
        assert any(v.get("persistentVolumeClaim", {}).get("claimName") == claim for v in spec["volumes"]), role
    words = [w for spec in pods(job(docs)).values() for c in spec["containers"] for w in
             c.get("command", []) + c.get("args", [])]
    assert "--auto-resume" in words and "/runs/checkpoint" in words


def test_a_broken_manifest_fails():
    mpi, ddp = job(render("horovod")), job(render("ddp"))
    pvc = next(d for d in render("ddp") if d["kind"] == "PersistentVolumeClaim")
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
        worker = pods(doc)["Worker"]["containers"][0]
        assert int(worker["resources"]["limits"]["nvidia.com/gpu"]) == gpus
        assert "resources" not in pods(doc)["Launcher"]["containers"][0]  # mpirun alone: no GPU
    assert example["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-queue"
    assert "kueue.x-k8s.io/queue-name" not in base["metadata"].get("labels", {})
    assert {c["image"] for spec in pods(example).values() for c in spec["containers"]} == \
        {"registry.example.com/cifar-horovod:latest"}
    # The launcher starts when the workers' sshd answers their readiness probe, on the port
    # mpi-pod.sh runs it on; it mounts the ssh keys where mpi-pod.sh looks for them.
    assert base["spec"]["launcherCreationPolicy"] == "WaitForWorkersReady"
    worker = pods(base)["Worker"]["containers"][0]
    assert worker["readinessProbe"]["tcpSocket"]["port"] == "ssh" and worker["ports"] == [
        {"name": "ssh", "containerPort": 2222}]
    with open(os.path.join(DEPLOY, "mpi-pod.sh")) as f:
        script = f.read()
    assert "SSH_PORT=${SSH_PORT:-2222}" in script
    assert f"SSH_DIR=${{SSH_DIR:-{base['spec']['sshAuthMountPath']}}}" in script
    ddp = job(render("ddp"))
    gpus = {int(spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]) for spec in pods(ddp).values()}
    assert gpus == {int(ddp["spec"]["nprocPerNode"])}


def test_the_documented_commands_apply_the_folders_tested_here():
    for doc, heading in (("README.md", "## Run on Kubernetes"), ("docs/MULTI_NODE.md", "## Kubernetes")):
        lines = readme_blocks(heading, doc)[0]
        words = [shlex.split(ln, comments=True) for ln in lines]
        assert all(w[:3] == ["kubectl", "apply", "-k"] and len(w) == 4 for w in words), lines
        assert {w[3] for w in words} <= {f"deploy/kubernetes/{f}" for f in FOLDERS}, lines
