"""The scaling model: the time of one training step of data-parallel SGD on N processes, from
the step's compute, its gradients and the network between the processes.

    step      = k x compute + exposed
    exposed   = max(0, allreduce - overlap x backward)      what training waits for
    allreduce = messages x latency + 2 (N - 1) / N x bytes / bandwidth

Assumptions, each a simplification:
- **Compute** (forward, backward and the optimizer step of one batch) is measured, not
  modelled, on the same processes and N; k is --batches-per-allreduce, whose k backward
  passes share one allreduce.
- **The allreduce is a ring**: every process sends and receives 2 (N - 1) / N times the
  gradients' bytes over its own link (Horovod's and NCCL's ring, Open MPI's large-message
  allreduce), and the slowest link sets the pace. Across nodes of several GPUs that link is
  the node's: a flat ring crosses it twice per node, so it carries the same 2 (N - 1) / N.
  `bandwidth` is the link's rate times the fraction of it a collective achieves
  (`efficiency`, fitted).
- **Bytes and messages**: fp16 compression halves the bytes. Each message costs a fixed
  `latency` (fitted). Without fusion (HOROVOD_FUSION_THRESHOLD=0) every gradient tensor is a
  message; with it, Horovod sends in one message the tensors that became ready in the same
  cycle (1 ms): as many messages as the cycles the last backward pass spans, at most one per
  tensor.
- **Overlap**: the allreduce runs while the last backward pass computes the remaining
  gradients; a fraction `overlap` (fitted) of that pass hides communication, the rest of the
  allreduce is exposed.

`fit` chooses (efficiency, latency, overlap) to minimise the largest relative error of the
step time over the points given; `predict` applies them.
"""
import itertools
import math

CYCLE_S = 0.001  # Horovod's default HOROVOD_CYCLE_TIME
FUSION_BYTES = 128 * 1024 * 1024  # Horovod's default HOROVOD_FUSION_THRESHOLD


def messages(tensors, fusion, backward_s):
    """Allreduce messages per step: one per tensor without fusion; with it, one per cycle the
    backward pass spans (tensors ready in one cycle go together), at most one per tensor, and
    at least one per fusion buffer."""
    if not fusion:
        return len(tensors)
    per_buffer = math.ceil(sum(tensors) / FUSION_BYTES)
    return max(per_buffer, min(len(tensors), math.ceil(backward_s / CYCLE_S)))


def allreduce_s(n, tensors, rate_bps, params, fp16=False, fusion=True, backward_s=0.0):
    """Seconds of one allreduce of the gradients (`tensors`: their fp32 bytes) over n
    processes on links of rate_bps bits per second."""
    if n < 2:
        return 0.0
    efficiency, latency, _ = params
    nbytes = sum(tensors) * (0.5 if fp16 else 1.0)
    ring = 2 * (n - 1) / n * nbytes * 8 / (rate_bps * efficiency)
    return messages(tensors, fusion, backward_s) * latency + ring


def step_s(point, params):
    """The model's step time for a point: a dict with n, tensors, rate_bps, compute_s and
    backward_s (one batch, measured), k, fp16, fusion."""
    k = point.get("k", 1)
    comm = allreduce_s(point["n"], point["tensors"], point["rate_bps"], params, point.get("fp16", False),
                       point.get("fusion", True), point["backward_s"])
    exposed = max(0.0, comm - params[2] * point["backward_s"])
    return k * point["compute_s"] + exposed


def relative_errors(points, params):
    return [abs(step_s(p, params) - p["step_s"]) / p["step_s"] for p in points]


GRID = {"efficiency": [x / 100 for x in range(40, 101, 2)],
        "latency": [0.0] + [10 ** (e / 4) * 1e-6 for e in range(0, 17)],  # 1 us .. 10 ms
        "overlap": [x / 20 for x in range(0, 21)]}


def fit(points):
    """(efficiency, latency, overlap) minimising the largest relative error of the step time
    over `points` (each with its measured step_s), by a search over a grid of each."""
    best = None
    for params in itertools.product(GRID["efficiency"], GRID["latency"], GRID["overlap"]):
        worst = max(relative_errors(points, params))
        if best is None or worst < best[0]:
            best = (worst, params)
    return best[1]


def efficiency(point, params):
    """The fraction of perfect scaling a point reaches: k batches of compute over its step."""
    return point.get("k", 1) * point["compute_s"] / step_s(point, params)
