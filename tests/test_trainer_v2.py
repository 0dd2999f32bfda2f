"""deploy/kubernetes/trainer/: main_ddp.py as a Kubeflow Trainer v2 TrainJob on the project's own
TrainingRuntime, as `kubectl kustomize` renders them, checked against the Trainer's v2.3.0 CRDs
(tests/data/crds/, SOURCES.md) with unknown fields refused, against what the Trainer's torch
plugin looks for (pkg/runtime/framework/plugins/torch), and against the rules the other jobs
meet (tests/test_kubernetes.py: the restricted profile, requests and limits, no Istio sidecar, a
TTL, images at a registry, the claim apart, a checkpoint folder of its own). No API server,
JobSet or Trainer runs here, and the pods are not run.
"""
import copy

from test_kubernetes import VENV_PYTHON, job, job_errors, layout_errors, render, schema_errors, templates


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
    assert layout_errors({f: render(f) for f in ("horovod", "ddp", "trainer", "storage")}) == []


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
