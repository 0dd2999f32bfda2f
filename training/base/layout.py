"""Memory layout: channels_last for fast convolutions, contiguous wherever a collective looks.

cuDNN runs convolutions fastest in NHWC ("channels_last"): the model's 4-D weights, their
gradients and the input all in that layout (`--channels-last`, on by default on CUDA).
Horovod's collectives refuse any tensor that is not contiguous in the default NCHW sense,
and a channels_last weight is not: its broadcast, its gradient's allreduce and its
momentum buffer's broadcast would all fail ("Tensor is required to be contiguous").
AccumulateGrad gives every gradient its parameter's layout, so making gradients
contiguous in a hook does not help. What this module does instead:

- `channels_last(model, optimizer)` converts weights and momentum buffers once, after
  the start-up broadcasts, which therefore see contiguous tensors (`contiguous` switches
  back for the elastic state sync, which broadcasts again).
- `GradLayout(compression)` is a Horovod compression that hands the allreduce a
  contiguous *view* of each channels_last gradient: an NCHW tensor in channels_last
  order is, element for element, the contiguous NHWC tensor `permute(0, 2, 3, 1)`. The
  allreduce works in place on that view, so no byte is copied. Averaging is
  elementwise, and Adasum's dot products and norms do not depend on element order, so
  the result is the same as on contiguous gradients.
- `contiguous_state(state)` makes what a checkpoint holds layout-free.

Nothing here imports Horovod; `GradLayout` follows its compression interface
(compress/decompress), which DistributedOptimizer calls around every allreduce.
"""
import contextlib

import torch

NHWC = (0, 2, 3, 1)  # NCHW -> NHWC
NCHW = (0, 3, 1, 2)  # NHWC -> NCHW


def use_channels_last(args, device):
    """Whether to train in channels_last: --channels-last / --no-channels-last,
    else on CUDA only."""
    return device.type == "cuda" if args.channels_last is None else args.channels_last


def memory_format(args, device):
    return torch.channels_last if use_channels_last(args, device) else torch.contiguous_format


def _is_channels_last(t):
    return (t.dim() == 4 and not t.is_contiguous()
            and t.is_contiguous(memory_format=torch.channels_last))


def _convert(model, optimizer, fmt):
    # keeps the Parameter objects: the optimizer's and Horovod's hooks stay
    model.to(memory_format=fmt)
    for p, state in optimizer.state.items():
        for k, v in state.items():
            if torch.is_tensor(v) and v.dim() == 4 and v.shape == p.shape:
                state[k] = v.contiguous(memory_format=fmt)


def channels_last(model, optimizer):
    """Weights, buffers and the optimizer's per-weight state (momentum) in channels_last."""
    _convert(model, optimizer, torch.channels_last)


def is_channels_last(model):
    return any(_is_channels_last(p) for p in model.parameters())


@contextlib.contextmanager
def contiguous(model, optimizer):
    """Model and optimizer state contiguous inside the block and, if they were in
    channels_last, back in it after: for collectives over the weights (an elastic sync)."""
    if not is_channels_last(model):
        yield
        return
    _convert(model, optimizer, torch.contiguous_format)
    try:
        yield
    finally:
        channels_last(model, optimizer)


def contiguous_state(obj):
    """A copy of a (nested) state dict whose channels_last tensors are made contiguous, so
    that a checkpoint loads the same into a model of either layout."""
    if torch.is_tensor(obj):
        return obj.contiguous() if _is_channels_last(obj) else obj
    if isinstance(obj, dict):
        return {k: contiguous_state(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(contiguous_state(v) for v in obj)
    return obj


class GradLayout:
    """Horovod compression that allreduces a channels_last gradient as its contiguous NHWC
    view (no copy), around another compression (none or fp16)."""

    def __init__(self, inner):
        self.inner = inner

    def compress(self, tensor):
        nhwc = _is_channels_last(tensor)
        if nhwc:
            tensor = tensor.permute(NHWC)  # contiguous, same storage
        elif not tensor.is_contiguous():
            tensor = tensor.contiguous()  # any other layout: a copy, which Horovod accepts
        compressed, ctx = self.inner.compress(tensor)
        return compressed, (nhwc, ctx)

    def decompress(self, tensor, ctx):
        nhwc, inner_ctx = ctx
        tensor = self.inner.decompress(tensor, inner_ctx)
        return tensor.permute(NCHW) if nhwc else tensor
