"""One model of each kind takes real optimizer steps under DDP at np=2, with every parameter's
gradient reduced and the weights moving alike on both ranks (tests/probes/every_model.py), and
four of them under Horovod on both its reductions: a hook per tensor, and one allreduce of
every gradient (--grad-allreduce one). That a model trains to an accuracy is shown for a few models
elsewhere.

One process group per port walks the models: SGD steps (two under DDP, one under Horovod) per
model as its trainer wraps it, then rank 0 says whether the weights moved, stayed finite and
agree on both ranks. DDP fails on a model with a parameter its forward never uses (the second
step raises "Expected to have finished reduction"), which is how EfficientNet's unused
expansion layer was found; models/efficientnet.py now leaves it untrained. Only the smallest
model of each set of module classes runs (22 of the 41: ResNet-18 for ResNet-34, not ResNet-152
beside ResNet-50): the others are the same code at other depths or widths, and that every
parameter of all 41 gets a gradient, and an unused one is frozen, is test_models.py's
forward/backward check, in process. That halves each port's run (Horovod's all-41 run took
91 s on 2 cores, DDP's 83 s). Horovod treats every model alike, a hook per gradient tensor or
one allreduce of them all (one buffer of its gradients, in the order of its parameters), so
both its reductions run on the four whose gradients differ most: the fewest tensors (LeNet),
the most (DenseNet), a parameter left untrained (EfficientNet) and grouped convolutions
(ShuffleNetV2). DDP's buckets and its check that every parameter took part depend on each
model's layers, so DDP walks all 22.
"""
import os
import subprocess

import pytest
import torch

from helpers import BIN, PY, env, probe_cmd
import models


def one_of_each_kind():
    """The smallest model (by parameters) of each set of module classes in the registry."""
    smallest = {}
    for name in models.MODELS:
        with torch.device("meta"):  # shapes only: no weights made
            model = models.get_model(name, num_classes=10)
        kind = frozenset(f"{type(m).__module__}.{type(m).__qualname__}" for m in model.modules())
        size = sum(p.numel() for p in model.parameters())
        if kind not in smallest or size < smallest[kind][0]:
            smallest[kind] = (size, name)
    return sorted(name for _, name in smallest.values())


@pytest.mark.parametrize("port", ["ddp", "horovod", "horovod-one"])
def test_every_model_steps_with_all_its_gradients_reduced_alike_at_np2(port):
    names = one_of_each_kind()
    assert len(names) == 22 and {"resnet18", "resnet50", "vgg11", "lenet"} <= set(names), names
    if port != "ddp":
        names = ["densenet_cifar", "efficientnetb0", "lenet", "shufflenetv2"]
    if port == "ddp":
        cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               *probe_cmd("every_model", "ddp")[1:], *names]
    else:
        cmd = [os.path.join(BIN, "horovodrun"), "-np", "2", "--gloo", *probe_cmd("every_model", port), *names]
    r = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    said = dict(line.rsplit(" ", 1) if line.endswith(" ok") else line.split(" FAILED: ", 1)
                for line in r.stdout.splitlines() if line.endswith(" ok") or " FAILED: " in line)
    said = {name.split("<stdout>:")[-1]: verdict for name, verdict in said.items()}  # horovodrun's prefix
    assert said == {name: "ok" for name in names}
