"""The scaling model: the time of one training step of data-parallel SGD on N processes, from
the step's compute, when its gradients become ready, and the network between the processes.

    step      = k x compute + exposed
    exposed   = max(0, end of the last allreduce - end of the last backward pass)
    allreduce = latency + 2 (N - 1) / N x bytes / bandwidth          (one message)

The allreduces of a step run one after another while the last of its k backward passes goes on:
each starts when its gradients are ready (for Horovod: at its next cycle) and the one before it
has ended, so the backward pass hides what it can of them. Assumptions, each a simplification:
- **Compute** (forward, backward and the optimizer step of one batch) is measured, not
  modelled; k is --batches-per-allreduce, whose k backward passes share one allreduce.
- **When gradients are ready**: `ready`, [(seconds after the backward pass starts, bytes)]
  for every gradient tensor in the order the pass makes them, from a layer profile
  (tools/layer_profile.py). Without one, the tensors, last layer first, are taken as ready at
  even steps through the backward pass. Under --compile (`compiled`) Horovod's hooks fire when
  the compiled backward pass ends: every gradient is ready then, and one allreduce of them all
  (--grad-allreduce one) sends the same bytes at the same time. Compiled "regions" (the model
  compiled block by block, utils.regions) makes each region's gradients ready when its
  backward ends: `ready` holds those times (tools/layer_profile.py). DDP's compiled wrapper is split
  into one graph per bucket (DDPOptimizer), so its buckets become ready as in eager mode.
- **Messages**: Horovod (`port` "horovod") wakes every cycle (`cycle_s`, by default its own 1 ms;
  the port sets 0.1 ms on CUDA) and sends in one fused
  message every tensor ready by then (up to the fusion buffer, 128 MB); with fusion off
  (HOROVOD_FUSION_THRESHOLD=0) each of them is a message of its own. While a message is on
  the wire the next cycle waits for it. The cycles keep their grid from step to step, so where
  a step falls against them settles into a pattern: the model simulates consecutive steps and
  takes the mean of the later ones, averaged over where the grid started. DDP (`port` "ddp")
  sends a bucket as soon as its last tensor is ready: buckets of 25 MB (the first 1 MB) filled
  in the order tensors become ready. fp16 compression halves the bytes.
- **The allreduce is a ring**: every process sends and receives 2 (N - 1) / N times a
  message's bytes over its own link (Horovod's, gloo's and NCCL's ring), and the slowest link
  sets the pace. Across nodes of several GPUs that link is the node's: a flat ring crosses it
  twice per node, so it carries the same 2 (N - 1) / N. `bandwidth` is the link's rate times
  the fraction of it a collective achieves (`efficiency`, fitted); each message costs a fixed
  `latency` (fitted).
- **The ring waits for its slowest link at every step**: its 2 (N - 1) steps are in lockstep
  (a process forwards what it has received), so each lasts as long as the slowest of the N
  links then, and the expected largest of N delays grows about as log N. The wire time is
  stretched by 1 + `spread` x log2(N / 2) (fitted; 0 at 2 processes, where `efficiency`
  already holds it). On the emulated cluster a lone allreduce of ResNet-18's gradients
  (44.7 MB, 25 Gbit/s) took 2.8% and 5.4% longer than the ring's 2 (N - 1) / N at 4 and 8
  hosts, scaled from 2. Emulated training at 2 to 16 hosts fits a spread of 0.005
  (benchmarks/scaling/probe_vs_emulator_error.py), and FITTED keeps 0.
- **Hierarchical allreduce** (`nodes`, `intra_bps`, `intra_latency_s`: HOROVOD_HIERARCHICAL_ALLREDUCE)
  is a ring of nodes between two steps inside each node (message_s). Checked on namespace hosts
  of 2 processes each against the algorithm composed of Horovod's own collectives
  (benchmarks/scaling/hierarchical_allreduce_error.py): gloo has no hierarchical path of its
  own. Composed so (`composed`), a message is 3 collectives, each enqueued when the one before
  it ends, and a cycle of Horovod's thread takes up the process sets one after another (the
  global set, the cross-node sets, the node sets). The step inside the node, on the emulator's
  free loopback, ends within the cycle that takes it up, before the cross-node sets' turn: the
  step across waits for the next cycle. As it ends, the node sets' turn in the same cycle comes
  at once, before the gather is in; the next cycle, which starts at once where the step across
  overran its own, or a cycle later, takes up the gather after the other sets have negotiated.
  Horovod's own hierarchical allreduce on NCCL is one collective.
- **Trees** (`algorithm`): "tree" is NCCL's double binary tree (NCCL_ALGO=Tree), two trees
  each carrying half the bytes, every process inside one and a leaf of the other, the reduction
  up and the broadcast down pipelined together; "binary-tree" is one binary tree, the reduction
  to the root and then the broadcast (Open MPI's allreduce "nonoverlapping" over its binary-tree
  reduce and broadcast). Both cut the message in TREE_SEGMENT_BYTES segments (tree_s). Checked
  on namespace hosts against Open MPI's binary tree (benchmarks/scaling/tree_allreduce_error.py);
  NCCL's double tree, which needs GPUs, is the same count of bytes a link carries, unchecked.

`fit` chooses (efficiency, latency, spread) to minimise the largest relative error of the
step time over the points given; `step_s` applies them. Two parameters, (efficiency,
latency), mean a spread of 0: what tools/allreduce.py measures at one N holds it already.
"""
import itertools
import math

CYCLE_S = 0.001  # Horovod's default HOROVOD_CYCLE_TIME
FUSION_BYTES = 128 * 1024 * 1024  # Horovod's default HOROVOD_FUSION_THRESHOLD
DDP_BUCKET_BYTES = 25 * 1024 * 1024  # DistributedDataParallel's bucket_cap_mb
DDP_FIRST_BUCKET_BYTES = 1024 * 1024  # and its first bucket's
PHASES = 4  # starting phases of Horovod's cycles averaged over
STEPS, SETTLE = 10, 4  # Horovod's steps simulated, and the first ones left out of the mean
# A tensor ready at a cycle's start, to the nanosecond, waits for the next one: a real step
# always takes a little longer than its compute (Python between steps, the hooks' own time).
# So a compute of whole cycles after a message ends, which puts every gradient on the grid,
# costs a cycle more, as it does in Horovod.
TIE_S = 1e-9
ALGORITHMS = ("ring", "tree", "binary-tree")
# The pieces a tree's message is cut into, each passed on as soon as it is in: NCCL's (4 MB
# buffers in 8 steps) and the segment the emulator's check gives Open MPI.
TREE_SEGMENT_BYTES = 512 * 1024

# (efficiency, latency s, spread) as the figure scaling_model_heldout_error fitted them on the emulator
# (benchmarks/results/RESULTS.md): what tools/emulate.py predicts with.
FITTED = (0.88, 1.8e-6, 0.0)


def ready_times(point):
    """[(seconds after the last backward pass starts, bytes)] of the gradient tensors in the
    order they become ready (see the module's docstring)."""
    if point.get("compiled") is True and point.get("port", "horovod") == "horovod":
        return [(point["backward_s"], b) for b in reversed(point["tensors"])]
    if point.get("ready"):
        return sorted(point["ready"], key=lambda r: r[0])
    tensors = list(reversed(point["tensors"]))
    return [(point["backward_s"] * (i + 1) / len(tensors), b) for i, b in enumerate(tensors)]


def tree_s(n, nbytes, bandwidth_bps, algorithm):
    """Seconds on the wire of a tree allreduce of nbytes over n processes, each on a link of
    bandwidth_bps each way. The busiest process bounds it: inside a binary tree it receives its
    two children's bytes (one child's at n = 2) as the reduction goes up, and sends the result to
    both as the broadcast comes down. One binary tree ("binary-tree") does the two one after the
    other: 2 x children x bytes. NCCL's double tree ("tree") halves the bytes of each tree and
    runs both phases at once, so each way a link carries twice the bytes (once at n = 2, where
    each process is the other's child in one tree and its parent in the other). Segments follow
    one another through the tree's levels: a pipeline of `depth` hops adds depth - 1 segments'
    time to each phase, up and down."""
    if algorithm not in ALGORITHMS[1:]:
        raise ValueError(f"a tree is one of {ALGORITHMS[1:]}, not {algorithm!r}")
    children = min(2, n - 1)
    if algorithm == "binary-tree":
        load, segment = 2 * children, children * TREE_SEGMENT_BYTES
    else:
        load, segment = children, TREE_SEGMENT_BYTES
    depth = int(math.log2(n))
    return (load * nbytes + 2 * (depth - 1) * segment) * 8 / bandwidth_bps


def message_s(n, nbytes, rate_bps, params, fp16=False, nodes=None, intra_bps=None, intra_latency_s=0.0,
              algorithm="ring"):
    """Seconds of one allreduce message of nbytes (fp32) over n processes: a flat ring, a tree
    (`algorithm`, over the nodes where `nodes` is given: a node is one link), or with
    `nodes` (Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE, n / nodes processes a node) a reduce-scatter
    inside each node over its internal links (intra_bps, at the fitted efficiency), a ring across
    the nodes in which each of a node's processes sends its share, and an allgather inside the
    node. The node's link carries 2 (nodes - 1) / nodes of the bytes, less than a flat ring's
    2 (n - 1) / n (which crosses it twice per node); the hierarchy's ring is also shorter, so
    its stretch grows with log2(nodes), not log2(n). It costs the two steps inside the node: a
    ring allreduce's bytes over the node's links (none where intra_bps is None: links taken as
    free) and intra_latency_s."""
    efficiency, latency = params[:2]
    spread = params[2] if len(params) > 2 else 0.0
    nbytes = nbytes * (0.5 if fp16 else 1.0)
    ring = n if nodes is None else nodes
    if algorithm not in ALGORITHMS:
        raise ValueError(f"the allreduce is one of {ALGORITHMS}, not {algorithm!r}")
    if algorithm != "ring":
        wire = tree_s(ring, nbytes, rate_bps * efficiency, algorithm) if ring > 1 else 0.0
        return latency + wire * (1 + spread * math.log2(max(ring, 2) / 2))
    wire = 2 * (ring - 1) / ring * nbytes * 8 / (rate_bps * efficiency) if ring > 1 else 0.0
    inside = 0.0
    if nodes is not None and n > nodes:
        per_node = n / nodes
        inside = intra_latency_s + (2 * (per_node - 1) / per_node * nbytes * 8 / (intra_bps * efficiency)
                                    if intra_bps else 0.0)
    return latency + wire * (1 + spread * math.log2(max(ring, 2) / 2)) + inside


def point_message_s(point, nbytes, params):
    """message_s for a point of step_s: its n, rate, fp16, algorithm and nodes."""
    return message_s(point["n"], nbytes, point["rate_bps"], params, point.get("fp16", False), point.get("nodes"),
                     point.get("intra_bps"), point.get("intra_latency_s", 0.0), point.get("algorithm", "ring"))


def ddp_buckets(sizes):
    """The bucket of each tensor, given their bytes in the order they become ready: DDP's
    buckets, and the graphs a compiled DDP model is split into (DDPOptimizer), close when they
    hold the cap (the first bucket's 1 MB, then 25 MB)."""
    out, size, bucket = [], 0, 0
    for b in sizes:
        out.append(bucket)
        size += b
        if size >= (DDP_FIRST_BUCKET_BYTES if bucket == 0 else DDP_BUCKET_BYTES):
            size, bucket = 0, bucket + 1
    return out


def ddp_end(ready, send):
    """When DDP's last bucket is reduced: each bucket sent when its last tensor is ready, after
    the bucket before it."""
    buckets = {}
    for (t, b), i in zip(ready, ddp_buckets([b for _, b in ready])):
        at, size = buckets.get(i, (0.0, 0))
        buckets[i] = (max(at, t), size + b)
    end = 0.0
    for i in sorted(buckets):
        t, b = buckets[i]
        end = max(end, t) + send(b)
    return end


def fused(batch, fusion):
    """The messages of one cycle's tensors: fused up to the fusion buffer, or one a tensor."""
    if not fusion:
        return batch
    messages, size = [0], 0
    for b in batch:
        if size + b > FUSION_BYTES and messages[-1]:
            messages.append(0)
            size = 0
        messages[-1] += b
        size += b
    return messages


def horovod_step_s(point, ready, send, phase):
    """Horovod's step time in the steady state: consecutive steps simulated, their mean period
    after the first few. Its background thread wakes on a grid of cycles (phase, phase + cycle,
    ...) that a message on the wire shifts: the next cycle starts when it ends. Each cycle sends
    what has become ready; synchronize() waits for the last message, then the optimizer step,
    the next forward passes and backward passes until the last one starts."""
    cycle, fusion, backward = point.get("cycle_s", CYCLE_S), point.get("fusion", True), point["backward_s"]
    lead = point.get("k", 1) * point["compute_s"] - backward  # from one step's wait to the next last backward
    tick, done, periods = phase, 0.0, []
    for _ in range(STEPS):
        start, i, last = done + lead, 0, 0.0
        while i < len(ready):
            at = start + ready[i][0]
            if at > tick - TIE_S:  # nothing new this cycle: the first one that has something
                tick += (math.floor((at - tick + TIE_S) / cycle) + 1) * cycle
            batch = []
            while i < len(ready) and start + ready[i][0] < tick - TIE_S:
                batch.append(ready[i][1])
                i += 1
            if point.get("composed"):  # inside the node, across (the bytes), inside again
                across = tick + cycle
                last = across + sum(send(b) for b in fused(batch, fusion))
                tick = last = max(across + cycle, last)
            else:
                last = tick + sum(send(b) for b in fused(batch, fusion))
            tick = max(tick + cycle, last)
        end = max(last, start + backward)
        periods.append(end - done)
        done = end
    return sum(periods[SETTLE:]) / (STEPS - SETTLE)


def step_s(point, params):
    """The model's step time for a point: a dict with n, tensors (fp32 bytes of each gradient,
    in the model's parameter order), rate_bps, compute_s and backward_s (one batch, measured);
    optional: ready, k, fp16, fusion, compiled, port, cycle_s, algorithm, nodes (with
    intra_bps and intra_latency_s for Horovod's hierarchical allreduce; message_s), and composed
    (Horovod: the hierarchical allreduce composed of 3 collectives; see the module's
    docstring)."""
    k_compute = point.get("k", 1) * point["compute_s"]
    if point["n"] < 2:
        return k_compute
    ready = ready_times(point)

    def send(nbytes):
        return point_message_s(point, nbytes, params)
    if point.get("port", "horovod") == "ddp":
        return k_compute + max(0.0, ddp_end(ready, send) - point["backward_s"])
    cycle = point.get("cycle_s", CYCLE_S)
    return sum(horovod_step_s(point, ready, send, cycle * p / PHASES) for p in range(PHASES)) / PHASES


def relative_errors(points, params):
    return [abs(step_s(p, params) - p["step_s"]) / p["step_s"] for p in points]


GRID = {"efficiency": [x / 100 for x in range(40, 101, 5)],
        "latency": [0.0] + [10 ** (e / 4) * 1e-6 for e in range(0, 17, 2)],  # 1 us .. 10 ms
        "spread": [x / 100 for x in range(0, 13, 3)]}


def fit(points):
    """(efficiency, latency, spread) minimising the largest relative error of the step time
    over `points` (each with its measured step_s): a search over a coarse grid of each, then
    over a finer one around the best. Points of one size of N cannot tell spread from
    efficiency: spread stays 0 there."""
    def search(efficiencies, latencies, spreads):
        return min(((max(relative_errors(points, params)), params)
                    for params in itertools.product(efficiencies, latencies, spreads)), key=lambda x: x[0])[1]
    spreads = GRID["spread"] if len({p["n"] for p in points}) > 1 else [0.0]
    e, lat, spread = search(GRID["efficiency"], GRID["latency"], spreads)
    fine_e = [round(e + x / 100, 2) for x in range(-5, 6) if 0 < e + x / 100 <= 1.0]
    fine_lat = [0.0] if lat == 0 else [lat * 10 ** (x / 16) for x in range(-4, 5)]
    fine_spread = sorted({max(0.0, round(spread + x / 100, 2)) for x in range(-2, 3)}) if len(spreads) > 1 else [0.0]
    return search(fine_e, [0.0, *fine_lat] if lat < 2e-6 else fine_lat, fine_spread)


def efficiency(point, params):
    """The fraction of perfect scaling a point reaches: k batches of compute over its step."""
    return point.get("k", 1) * point["compute_s"] / step_s(point, params)
