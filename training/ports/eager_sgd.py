"""torch.optim.SGD that does not import torch's compiler, for runs that never trace it.

torch.optim imports torch._dynamo (the compiler's front end, with sympy, its graph tracer and
FSDP's modules) the first time an optimizer adds a parameter group, zeroes its gradients or
steps: the base class's methods are marked "never trace" through a wrapper that imports Dynamo
on its first call, and SGD.step breaks a traced graph before it runs. Neither does anything for
an optimizer that no one traces, and none of the trainers traces its optimizer (--compile
compiles the model alone), yet the import costs every process 2-3 s of CPU at start-up on a
2-core machine (docs/PERFORMANCE.md). `sgd` returns an SGD whose step runs torch's own update
under no_grad, as torch's wrapper does outside a trace, and marks the base class's wrapped
methods as already resolved to themselves, which is what their wrapper would find and call.

Both rest on how torch 2.x wraps these methods. Where a torch wraps them otherwise, `sgd`
returns torch.optim.SGD itself: the same updates, with the import.
"""
import functools
import inspect

import torch

# Optimizer's methods that torch wraps with torch._disable_dynamo, which imports Dynamo on the
# first call and caches what it made in the wrapped function's __dynamo_disable.
_MARKED = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")
_CACHE = "__dynamo_disable"


def _wrapped_methods():
    """The functions inside the base class's marked methods, or None where one is not wrapped
    as torch 2.x wraps it (a wrapper from torch/_compile.py with the function as __wrapped__)."""
    found = []
    for name in _MARKED:
        method = getattr(torch.optim.Optimizer, name, None)
        inner, code = getattr(method, "__wrapped__", None), getattr(method, "__code__", None)
        if inner is None or code is None or not code.co_filename.endswith("_compile.py"):
            return None
        found.append(inner)
    return found


@functools.cache
def _update():
    """SGD's own update, under its step's wrappers (the profiler's hook and the one that
    breaks a traced graph), or None where it cannot be told apart from them."""
    inner = inspect.unwrap(torch.optim.SGD.step)
    return inner if inner.__qualname__ == "SGD.step" else None


class EagerSGD(torch.optim.SGD):
    """torch.optim.SGD whose step is torch's update under no_grad, without the wrapper that
    imports Dynamo to break a trace."""

    def step(self, closure=None):
        with torch.no_grad():
            return _update()(self, closure)


def sgd(params, **kwargs):
    """torch.optim.SGD(params, **kwargs), started without importing torch._dynamo where the
    installed torch wraps its methods as torch 2.x does. Not for an optimizer that is traced."""
    methods, update = _wrapped_methods(), _update()
    if methods is None or update is None or kwargs.get("differentiable"):
        return torch.optim.SGD(params, **kwargs)
    for inner in methods:
        if getattr(inner, _CACHE, None) is None:
            setattr(inner, _CACHE, inner)
    return EagerSGD(params, **kwargs)
