"""Three fp16 AMP steps of LeNet through hvd_port.distributed_optimizer at np=1, on the CPU.

    HOROVOD_ELASTIC=1 python tests/probes/fp16_steps.py

Prints whether the wrapped optimizer still tells GradScaler that its fused step skips
inf steps itself, and how many values the three steps read back to the host (each
a device sync on a GPU). Without the flag, GradScaler reads found_inf once a step.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402

from training.ports import hvd_port  # noqa: E402
from training.run import cli  # noqa: E402
import utils  # noqa: E402

hvd.init()
args = cli.parse_args(cli.add_horovod_args(cli.build_parser("")),
                      ["--arch", "lenet", "--amp", "--amp-dtype", "float16"])
model = utils.build_model(args, torch.device("cpu"))
optimizer = hvd_port.distributed_optimizer(args, model, utils.make_optimizer(model, args))
scaler = utils.make_scaler(args, torch.device("cpu"))
for group in optimizer.param_groups:
    group["lr"] = 0.1  # make_optimizer leaves it to the schedule
reads = []
item = torch.Tensor.item


def counted(self, *a):
    reads.append(1)
    return item(self, *a)


torch.Tensor.item = counted
before = model.conv1.weight.detach().clone()
for _ in range(3):
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(torch.randn(4, 3, 32, 32)).logsumexp(1).mean()
    scaler.scale(loss).backward()
    utils.optimizer_step(optimizer, scaler)
torch.Tensor.item = item
print(getattr(optimizer, "_step_supports_amp_scaling", False), len(reads),
      not torch.equal(before, model.conv1.weight))
