"""One training step of ResNet-18 in channels_last through Horovod's gradient hooks at np=1.

    HOROVOD_ELASTIC=1 python tests/probes/grad_hooks.py layout|plain

Prints: the hooks that started an allreduce during backward, the parameter count,
whether conv1's gradient is channels_last, and whether every 4-D weight moved.
With `plain` (no layout.GradLayout) the step fails as Horovod refuses the
non-contiguous gradients.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402

from training.base import layout  # noqa: E402
from training.run import cli  # noqa: E402
import utils  # noqa: E402

hvd.init()
args = cli.parse_args(cli.build_parser(""), ["--arch", "resnet18", "--channels-last"])
model = utils.build_model(args, torch.device("cpu"))
optimizer = hvd.DistributedOptimizer(utils.make_optimizer(model, args), named_parameters=model.named_parameters(),
                                     compression=layout.GradLayout(hvd.Compression.none)
                                     if sys.argv[1] == "layout" else hvd.Compression.none)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)   # the hidden step: momentum, contiguous
optimizer.state.clear()
for group in optimizer.param_groups:
    group["lr"] = 0.1  # make_optimizer leaves it to the schedule
train = utils.training_model(args, model, optimizer)
before = {n: p.detach().clone() for n, p in model.named_parameters()}
x = torch.randn(4, 3, 32, 32).contiguous(memory_format=torch.channels_last)
train(x).logsumexp(1).sum().backward()
fired = len(optimizer._handles)  # hooks that started an allreduce during backward
optimizer.step()
conv = model.conv1.weight
print(fired, len(list(model.parameters())), conv.grad.is_contiguous(memory_format=torch.channels_last),
      all(not torch.equal(before[n], p) for n, p in model.named_parameters() if p.dim() == 4))
